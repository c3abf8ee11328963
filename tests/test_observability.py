"""Observability: the stats leader's gauges, the metrics the dashboard and alerts rely on, and
counters moving by the right amount in a real multi-process scenario."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from promptsched import metrics as metric_words
from promptsched.clock import FrozenClock
from promptsched.domain import DeliveryOutcome, RunStatus
from promptsched.executors.limiter import Limiter
from promptsched.metrics import QUEUE_STATUSES, Metrics
from promptsched.roles.stats import Stats
from promptsched.store import sqlfiles
from tests import factories
from tests.factories import EPOCH, runs_settled
from tests.helpers import Service, wait_until

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "grafana" / "dashboards" / "promptsched.json"
ALERTS = ROOT / "deploy" / "alerts.yml"
HPA = ROOT / "deploy" / "k8s" / "optional" / "hpa.yaml"

# --- the stats leader -----------------------------------------------------------------------


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _async(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


def _series(metrics: Metrics, name: str) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    ]


async def _running_run(pool: asyncpg.Pool[Any], schedule_id: int, lease_left: timedelta) -> int:
    slot = EPOCH - timedelta(minutes=5) + lease_left  # distinct per run
    rid = await factories.pending_run(pool, schedule_id, slot)
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt_id = gen_random_uuid(), attempts = 1, "
        "worker_id = 'w', attempt_started_at = $3::timestamptz - interval '5 minutes', "
        "lease_expires_at = $2, deadline_at = $3 WHERE id = $1",
        rid,
        EPOCH + lease_left,
        EPOCH + timedelta(minutes=5),
    )
    return rid


async def test_only_the_leader_exports_the_queue_gauges_and_another_takes_over(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await factories.schedule(pool)
    await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=30))
    await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=10))
    await factories.pending_run(pool, sid, EPOCH + timedelta(seconds=60))  # a retry in backoff
    await _running_run(pool, sid, timedelta(seconds=-1))  # its worker vanished
    await _running_run(pool, sid, timedelta(seconds=20))
    first, second = Stats(pool, clock, Metrics()), Stats(pool, clock, Metrics())
    try:
        assert await first.run_once() is True
        assert await second.run_once() is False
        leader = first.metrics
        assert _value(leader, "promptsched_queue_depth", status="pending") == 2
        assert _value(leader, "promptsched_queue_depth", status="scheduled") == 1
        assert _value(leader, "promptsched_queue_depth", status="running") == 2
        assert _value(leader, "promptsched_stuck_runs", reason="lease_expired") == 1
        assert _value(leader, "promptsched_stuck_runs", reason="deadline_passed") == 0
        assert _value(leader, "promptsched_oldest_pending_age_seconds", provider="echo") == 30
        assert _value(leader, "promptsched_stats_leader") == 1
        # The other replica exports no series at all, so sum() over replicas stays exact.
        for name in ("promptsched_queue_depth", "promptsched_stuck_runs"):
            assert _series(second.metrics, name) == []
        assert _series(second.metrics, "promptsched_oldest_pending_age_seconds") == []
        assert _value(second.metrics, "promptsched_stats_leader") == 0
        # The leader stops (and steps down): the next try of the other one wins.
        await first.close()
        assert _series(first.metrics, "promptsched_queue_depth") == []
        await wait_until(second.run_once, timeout=5, what="the other replica to lead")
        assert _value(second.metrics, "promptsched_queue_depth", status="pending") == 2
        assert await first.run_once() is False
    finally:
        await first.close()
        await second.close()


async def test_the_waiting_gauges_count_apart_what_no_replica_could_claim_now(
    pool: asyncpg.Pool[Any],
) -> None:
    # A buffered schedule with a run going and two due behind it, a provider held by its
    # fleet-wide concurrency, one whose breaker is open, and one claimable run: only that one
    # is pending, and the oldest pending age is its own, not the buffered runs' (issue: the
    # gauge read minutes while nothing was claimable, and the autoscaler added replicas).
    clock = FrozenClock(EPOCH)
    buffered = await factories.schedule(pool, overlap="buffer_all")
    await _running_run(pool, buffered, timedelta(seconds=30))
    for minutes in (4, 3):
        rid = await factories.pending_run(pool, buffered, EPOCH - timedelta(minutes=minutes))
        await pool.execute("UPDATE runs SET serial = true WHERE id = $1", rid)
    plain = await factories.schedule(pool)
    await factories.pending_run(pool, plain, EPOCH - timedelta(seconds=20))
    limited, tripped = await factories.schedule(pool), await factories.schedule(pool)
    await pool.execute("UPDATE schedules SET provider = 'limited' WHERE id = $1", limited)
    await pool.execute("UPDATE schedules SET provider = 'tripped' WHERE id = $1", tripped)
    await _running_run(pool, limited, timedelta(seconds=25))
    for seconds in (50, 40, 35):
        await factories.pending_run(pool, limited, EPOCH - timedelta(seconds=seconds))
        await factories.pending_run(pool, tripped, EPOCH - timedelta(seconds=seconds))
    await pool.execute(
        "INSERT INTO provider_buckets (provider, open_until, failures) VALUES ('tripped', $1, 5)",
        EPOCH + timedelta(seconds=30),
    )
    metrics = Metrics()
    metrics.know({name: ("default",) for name in ("echo", "limited", "tripped", "idle")})
    limiters = {name: Limiter(1, fleet=True) for name in ("limited", "tripped")}
    stats = Stats(pool, clock, metrics, limiters=limiters)
    try:
        assert await stats.run_once() is True
        depth = {s: _value(metrics, "promptsched_queue_depth", status=s) for s in QUEUE_STATUSES}
        assert depth == {
            "pending": 1,
            "waiting_predecessor": 2,
            "held_by_provider": 6,
            "scheduled": 0,
            "running": 2,
        }
        age = "promptsched_oldest_pending_age_seconds"
        assert _value(metrics, age, provider="echo") == 20
        for provider in ("limited", "tripped", "idle"):
            assert _value(metrics, age, provider=provider) == 0, provider
        held = "promptsched_held_runs"
        assert _value(metrics, held, provider="limited", reason="concurrency") == 3
        assert _value(metrics, held, provider="tripped", reason="open") == 3
        assert _value(metrics, held, provider="echo", reason="open") == 0
        # The predecessor finishes: the first buffered run is claimable, and has been so
        # since then, not since its slot four minutes ago.
        await pool.execute(
            "UPDATE runs SET status = 'succeeded', finished_at = $2, attempt_id = NULL, "
            "lease_expires_at = NULL WHERE schedule_id = $1 AND status = 'running'",
            buffered,
            EPOCH - timedelta(seconds=5),
        )
        assert await stats.run_once() is True
        assert _value(metrics, "promptsched_queue_depth", status="pending") == 2
        assert _value(metrics, "promptsched_queue_depth", status="waiting_predecessor") == 1
        assert _value(metrics, age, provider="echo") == 20
    finally:
        await stats.close()


async def test_a_leader_that_stops_renewing_loses_the_duty_when_its_term_expires(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    term = timedelta(seconds=15)
    first, second = (Stats(pool, clock, Metrics(), term=term) for _ in range(2))
    try:
        assert await first.run_once() is True
        # The first one freezes (no renewal, no clean stop): its term runs on Postgres's clock.
        clock.advance(term - timedelta(milliseconds=1))
        assert await second.run_once() is False
        clock.advance(timedelta(milliseconds=1))
        assert await second.run_once() is True
        assert _value(second.metrics, "promptsched_stats_leader") == 1
        # The old leader's renewal finds the duty taken: it stops exporting.
        assert await first.run_once() is False
        assert _series(first.metrics, "promptsched_queue_depth") == []
        assert _value(first.metrics, "promptsched_stats_leader") == 0
        row = await pool.fetchrow("SELECT holder, term FROM leaders WHERE name = 'stats'")
        assert row is not None and (row["holder"], row["term"]) == (second.holder, 2)
    finally:
        await first.close()
        await second.close()


async def test_replicas_racing_for_a_free_duty_elect_exactly_one(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    for round_ in range(5):
        replicas = [Stats(pool, clock, Metrics()) for _ in range(8)]
        try:
            won = await asyncio.gather(*(replica.run_once() for replica in replicas))
            assert sum(won) == 1, (round_, won)
            leaders = [r.holder for r in replicas if r.leader]
            held = await pool.fetchval("SELECT holder FROM leaders WHERE name = 'stats'")
            assert leaders == [held]
        finally:
            for replica in replicas:
                await replica.close()
        assert await pool.fetchval("SELECT count(*) FROM leaders") == 0  # a stop steps down


async def test_a_leader_whose_local_term_ran_out_stops_saying_it_leads(
    pool: asyncpg.Pool[Any],
) -> None:
    # Its belief is bounded by its own monotonic deadline, not only by the next renewal, so a
    # replica frozen past its term does not report itself leader beside the new one.
    stats = Stats(pool, FrozenClock(EPOCH), Metrics(), interval=timedelta(milliseconds=50),
                  term=timedelta(milliseconds=200))  # fmt: skip
    try:
        assert await stats.run_once() is True
        assert _value(stats.metrics, "promptsched_stats_leader") == 1
        await wait_until(
            _async(lambda: _value(stats.metrics, "promptsched_stats_leader") == 0),
            timeout=5,
            what="the local term to run out",
        )
        assert stats.leader is False
    finally:
        await stats.close()


async def test_outbox_depth_counts_undelivered_notifications(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    sid = await factories.schedule(pool)
    rid = await factories.pending_run(pool, sid)
    statuses = ["pending", "pending", "dead", "sent", "sent", "sent"]
    await pool.execute(
        "INSERT INTO outbox (run_id, schedule_id, channel, target, event, status, "
        "idempotency_key) SELECT $1, $2, 'webhook', '{}'::jsonb, 'succeeded', s, 'k' || n "
        "FROM unnest($3::text[]) WITH ORDINALITY AS t(s, n)",
        rid,
        sid,
        statuses,
    )
    stats = Stats(pool, FrozenClock(EPOCH), Metrics())
    try:
        assert await stats.run_once() is True
        assert _value(stats.metrics, "promptsched_outbox_depth", status="pending") == 2
        assert _value(stats.metrics, "promptsched_outbox_depth", status="sending") == 0
        assert _value(stats.metrics, "promptsched_outbox_depth", status="dead") == 1
        assert _value(stats.metrics, "promptsched_outbox_depth", status="sent") is None
    finally:
        await stats.close()


async def test_stats_queries_never_scan_the_run_history(pool: asyncpg.Pool[Any]) -> None:
    async with pool.acquire() as conn:
        sid = await factories.schedule(pool)
        await conn.execute(
            "INSERT INTO runs (schedule_id, slot, provider, max_attempts, status, finished_at) "
            "SELECT $1, now() - g * interval '1 second', CASE WHEN g % 200 = 0 THEN 'echo' "
            "ELSE 'openai' END, 3, CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'succeeded' END, "
            "CASE WHEN g % 100 = 0 THEN NULL ELSE now() END FROM generate_series(1, 50000) g",
            sid,
        )
        await conn.execute("ANALYZE runs")
        for name in ("stats_queue_depth", "stats_pending_runs"):
            rows = await conn.fetch(f"EXPLAIN (FORMAT TEXT) {sqlfiles.queries()[name]}", None)
            plan = "\n".join(row[0] for row in rows)
            assert "Seq Scan on runs" not in plan, plan
        ages = await conn.fetch(sqlfiles.queries()["stats_pending_runs"], None)
        assert sorted(row["provider"] for row in ages) == ["echo", "openai"]


# --- the dashboard and the alert rules use only exported metrics -----------------------------

# Series Prometheus itself adds to every target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Labels Prometheus or its service discovery attach, and histogram buckets.
TARGET_LABELS = {"le", "instance", "job", "pod", "namespace", "service", "container", "endpoint"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
KEYWORDS |= {"and", "or", "unless", "inf", "nan"}
# label_replace(v, "dst", "replacement", "src", "regex"): the dst label it writes.
_REPLACED = r',\s*"(\w+)",\s*"[^"]*",\s*"[^"]*",\s*"[^"]*"\s*\)'


def exported() -> dict[str, set[str]]:
    """Every sample name the code exports, with the labels it carries."""
    metrics = Metrics()
    names: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
    }
    for collector in vars(metrics).values():
        if isinstance(collector, MetricWrapperBase):
            labels = set(collector._labelnames)
            for suffix in suffixes[collector._type]:
                names.setdefault(collector._name + suffix, set()).update(labels)
    return names


def _strip(expr: str) -> str:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\$\{?\w+\}?", "1", expr)  # Grafana variables
    return re.sub(r"\[[^\]]*\]", "", expr)  # range selectors and subqueries


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (functions, keywords, labels left out)."""
    text = re.sub(r"\{[^}]*\}", " ", _strip(expr))
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)\s*(\()?", text):
        name, call = match.group(1), match.group(2)
        if not call and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """``(metric, labels matched in its selector)`` for each ``metric{...}`` in the expression."""
    found = []
    for name, body in re.findall(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", _strip(expr)):
        found.append((name, set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", body))))
    return found


def grouping_labels(expr: str) -> set[str]:
    found: set[str] = set()
    for body in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", _strip(expr)):
        found |= {label.strip() for label in body.split(",") if label.strip()}
    return found


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [value for key, value in _walk(dashboard["panels"]) if key == "expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            text = query["query"] if isinstance(query, dict) else query
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", text))
    return exprs


def alert_exprs() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_in_the_dashboard_and_alerts_is_exported(source: str) -> None:
    exprs = dashboard_exprs() if source == "dashboard" else alert_exprs()
    names = exported()
    used: set[str] = set()
    problems = []
    for expr in exprs:
        series = metric_names(expr)
        used |= series
        problems += [f"{name} (in {expr})" for name in sorted(series - names.keys() - SYNTHETIC)]
        for name, labels in selector_labels(expr):
            unknown = labels - names.get(name, set()) - TARGET_LABELS
            problems += [f"{name} has no label {label} (in {expr})" for label in sorted(unknown)]
        known = set().union(*(names.get(name, set()) for name in series)) | TARGET_LABELS
        known |= set(re.findall(_REPLACED, expr))  # labels label_replace() adds
        problems += [f"no label {label} (in {expr})" for label in grouping_labels(expr) - known]
    assert problems == []
    assert len(used) >= 8, f"the {source} reads suspiciously few metrics: {sorted(used)}"


def test_the_extractor_sees_names_and_not_functions_or_labels() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, provider) (rate(promptsched_run_duration_seconds"
        '_bucket{instance=~"$instance"}[$__rate_interval]))) > on(provider) group_left '
        "promptsched_retries_total or vector(0) and up == 1"
    )
    assert metric_names(expr) == {
        "promptsched_run_duration_seconds_bucket",
        "promptsched_retries_total",
        "up",
    }
    assert grouping_labels(expr) == {"le", "provider"}
    assert selector_labels(expr) == [("promptsched_run_duration_seconds_bucket", {"instance"})]
    assert "promptsched_ticks" not in exported(), "a counter is exported as ..._total"


# Gauges the stats leader reads for the whole fleet: they follow the fleet, not the replica.
FLEET_GAUGES = {
    "promptsched_queue_depth",
    "promptsched_oldest_pending_age_seconds",
    "promptsched_held_runs",
    "promptsched_stuck_runs",
    "promptsched_outbox_depth",
}


def test_every_dashboard_query_honours_the_fleet_and_replica_selectors() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [value for key, value in _walk(dashboard["panels"]) if key == "expr"]
    problems = []
    for expr in exprs:
        selected = dict(re.findall(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr))
        for name in metric_names(expr):
            body = selected.get(name, "")
            wanted = ['job=~"$job"']
            if name not in FLEET_GAUGES and name != "promptsched_stats_leader":
                wanted.append('instance=~"$instance"')
            problems += [f"{name} without {w} in {expr}" for w in wanted if w not in body]
    assert problems == []
    assert len(exprs) >= 30


def test_the_dashboard_covers_every_promise() -> None:
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    wanted = {
        "promptsched_ticks_total",
        "promptsched_tick_lag_seconds_bucket",
        "promptsched_dropped_ticks_total",
        "promptsched_start_lag_seconds_bucket",
        "promptsched_run_duration_seconds_bucket",
        "promptsched_run_duration_seconds_count",
        "promptsched_retries_total",
        "promptsched_dead_letters_total",
        "promptsched_claims_total",
        "promptsched_scheduler_batches_total",
        "promptsched_leases_lost_total",
        "promptsched_leases_reaped_total",
        "promptsched_fenced_writes_total",
        "promptsched_queue_depth",
        "promptsched_oldest_pending_age_seconds",
        "promptsched_outbox_depth",
        "promptsched_deliveries_total",
        "promptsched_worker_slots",
        "promptsched_stuck_runs",
        "promptsched_scheduler_last_tick_timestamp_seconds",
        "promptsched_held_runs",
        "promptsched_role_errors_total",
        "promptsched_llm_cost_total",
    }
    assert wanted - used == set()


def test_the_metrics_reference_documents_every_metric() -> None:
    doc = (ROOT / "docs" / "observability.md").read_text()
    missing = [
        collector._name + _SUFFIX[collector._type]
        for collector in vars(Metrics()).values()
        if isinstance(collector, MetricWrapperBase)
        and f"`{collector._name + _SUFFIX[collector._type]}`" not in doc
    ]
    assert missing == [], "add them to docs/observability.md"


_SUFFIX = {"counter": "_total", "histogram": "", "gauge": ""}


def documented_labels() -> dict[str, dict[str, set[str] | None]]:
    """The metrics table of docs/observability.md: metric -> label -> its values (None: a
    label whose values come from the configuration, such as ``provider``)."""
    doc = (ROOT / "docs" / "observability.md").read_text()
    table: dict[str, dict[str, set[str] | None]] = {}
    for name, cell in re.findall(r"^\| `(promptsched_\w+)` \| \w+ \|([^|]*)\|", doc, re.M):
        labels: dict[str, set[str] | None] = {}
        for part in filter(str.strip, cell.split(";")):
            match = re.fullmatch(r"\s*`(\w+)`(?::(.*))?\s*", part)
            assert match, f"{name}: write its labels as `label`: `value`, ... ({part!r})"
            values = match[2]
            labels[match[1]] = set(re.findall(r"`(\w+)`", values)) if values else None
        table[name] = labels
    return table


def test_help_texts_the_docs_and_the_exported_series_name_the_same_label_values() -> None:
    metrics = Metrics()
    metrics.know({"echo": ("default",), "openai": ("gpt-4o",)})
    documented = documented_labels()
    exported_values: dict[tuple[str, str], set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            for label, value in sample.labels.items():
                exported_values.setdefault((family.name, label), set()).add(value)
    problems = []
    for collector in vars(metrics).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        name = collector._name + _SUFFIX[collector._type]
        domains, zero = metrics.domains.get(collector, ({}, False))
        doc = documented.get(name)
        if doc is None or set(doc) != set(domains):
            problems.append(f"{name}: labels {sorted(domains)}, documented {doc}")
            continue
        for label, values in domains.items():
            fixed = set(values) if isinstance(values, tuple) else None
            if doc[label] != fixed:
                problems.append(f"{name}{{{label}}}: {fixed} in the code, {doc[label]} in the docs")
            said = ", ".join(values) if isinstance(values, tuple) else values
            if f"{label}: {said}" not in collector._documentation:
                problems.append(f"{name}{{{label}}}: its help text does not list {said}")
            seen = exported_values.get((collector._name, label), set())
            if zero and fixed is not None and seen != fixed:
                problems.append(f"{name}{{{label}}}: exports {seen} at startup, not {fixed}")
    assert problems == []


def test_every_labelled_series_exists_from_startup_and_models_stay_bounded() -> None:
    metrics = Metrics()
    metrics.know({"echo": ("default",), "openai": ("gpt-4o", "gpt-4o-mini")})
    series = {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in metrics.registry.collect()
        for sample in family.samples
    }
    for wanted in (
        ("promptsched_dropped_ticks_total", (("reason", "misfire"),)),
        ("promptsched_runs_finished_total", (("status", "dead"),)),
        ("promptsched_deliveries_total", (("channel", "ntfy"), ("outcome", "dead"))),
        ("promptsched_role_errors_total", (("role", "reaper"),)),
        ("promptsched_retries_total", (("provider", "openai"),)),
        ("promptsched_llm_cost_total", (("model", "other"), ("provider", "openai"))),
        ("promptsched_run_duration_seconds_count", (("outcome", "failed"), ("provider", "echo"))),
    ):
        assert wanted in series, wanted
    assert not [name for name, _ in series if name.endswith("_created")]
    assert metrics.model("openai", "gpt-4o-mini") == "gpt-4o-mini"
    assert metrics.model("openai", "default") == "other"  # openai's own default is known
    assert metrics.model("echo", "gpt-4o") == "other"  # priced for another provider only
    assert metrics.model("nobody", "x") == "other"


def _selects(expr: str, metric: str, labels: dict[str, str]) -> bool:
    """Whether every selector of ``metric`` in ``expr`` matches a series with ``labels``."""
    selectors = re.findall(re.escape(metric) + r"\s*\{([^}]*)\}", expr)
    assert selectors, f"{metric} is not read with a selector in {expr}"
    for body in selectors:
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body):
            actual = labels.get(label, "")
            matched = (
                re.fullmatch(value, actual) is not None if op in ("=~", "!~") else value == actual
            )
            if matched != (op in ("=", "=~")):
                return False
    return True


def test_the_dropped_ticks_alert_fires_only_for_slots_found_late() -> None:
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    (rule,) = [r for r in rules if r["alert"] == "PromptschedTicksDropped"]
    metric = "promptsched_dropped_ticks_total"
    # overlap has its own (info) alert; disabled and cancelled_by_overlap are what pausing a
    # schedule and overlap cancel_other are for.
    for normal in ("overlap", "disabled", "cancelled_by_overlap"):
        assert not _selects(rule["expr"], metric, {"reason": normal}), normal
    for trouble in ("misfire", "catchup_window"):
        assert _selects(rule["expr"], metric, {"reason": trouble}), trouble


def test_the_hpa_scales_on_an_exported_gauge() -> None:
    hpa = yaml.safe_load(HPA.read_text())
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]
    assert metric["name"] in exported()
    assert set(metric["selector"]["matchLabels"]) <= exported()[metric["name"]]


# --- counters move by the right amount in a real scenario ------------------------------------


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def _scrape(service: Service) -> Samples:
    port = service.has_event("api.listening")["port"]  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return _get(after, name, **labels) - _get(before, name, **labels)


async def _manual_run(pool: asyncpg.Pool[Any], **schedule: Any) -> int:
    sid = await factories.schedule(pool, next_fire_at=None, **schedule)
    return await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")


async def _count(pool: asyncpg.Pool[Any], where: str, *args: Any) -> int:
    count: int = await pool.fetchval(f"SELECT count(*) FROM runs WHERE {where}", *args)
    return count


def _roles(roles: str) -> dict[str, str]:
    return {"PROMPTSCHED_ROLES": roles}


@pytest.mark.slow
async def test_a_crash_a_retry_an_overlap_skip_and_a_dead_letter_move_their_counters(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    # One scheduler+reaper process, and worker processes: the first is killed mid-run.
    control = Service(dsn, tmp_path / "control.log", env=_roles("scheduler,reaper,api"))
    victim: Service | None = None
    worker: Service | None = None
    try:
        await control.ready()

        async def control_is_stats_leader() -> bool:
            return _get(await _scrape(control), "promptsched_stats_leader") == 1

        await wait_until(control_is_stats_leader, timeout=15, what="the stats leader")
        victim = Service(dsn, tmp_path / "victim.log", env=_roles("worker,api"))
        await victim.ready()
        control_before = await _scrape(control)

        # A crash: the victim dies holding a run; the control process reaps the lease.
        crashed = await _manual_run(pool, params={"latency": "3s"})

        async def held_by_victim() -> bool:
            holder = await pool.fetchval("SELECT worker_id FROM runs WHERE id = $1", crashed)
            return victim is not None and str(holder).endswith(f":{victim.pid}")

        await wait_until(held_by_victim, timeout=10, what="the victim to claim")
        victim.signal(signal.SIGKILL)
        victim.process.wait(10)

        async def reaped() -> bool:
            return await _count(pool, "id = $1 AND status = 'pending'", crashed) == 1

        await wait_until(reaped, timeout=15, what="the reaper to take the lease back")

        async def backlog_seen() -> Samples | None:
            samples = await _scrape(control)
            return samples if _get(samples, "promptsched_queue_depth", status="pending") else None

        queued = await wait_until(backlog_seen, timeout=15, what="queue depth from the leader")
        assert _get(queued, "promptsched_queue_depth", status="pending") == 1
        assert _get(queued, "promptsched_oldest_pending_age_seconds", provider="echo") >= 0

        worker = Service(dsn, tmp_path / "worker.log", env=_roles("worker,api"))
        await worker.ready()
        worker_before = await _scrape(worker)

        # A retry, a dead letter, and a per-second schedule whose runs outlast their slot.
        flaky = await _manual_run(pool, params={"fail_attempts": 1}, max_attempts=3)
        doomed = await _manual_run(pool, params={"fail_attempts": 9}, max_attempts=1)
        ticking = await factories.ticking_schedule(pool, params={"latency": "3s"}, overlap="skip")

        async def skipped_twice() -> bool:
            where = "schedule_id = $1 AND skip_reason = 'overlap'"
            return await _count(pool, where, ticking) >= 2

        await wait_until(skipped_twice, timeout=20, what="two overlap skips")
        await pool.execute("UPDATE schedules SET enabled = false WHERE id = $1", ticking)

        await wait_until(lambda: runs_settled(pool), timeout=20, what="every run to finish")
        control_after = await _scrape(control)
        worker_after = await _scrape(worker)
    finally:
        for service in (control, victim, worker):
            if service is not None:
                service.stop()

    statuses = {
        rid: await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid)
        for rid in (crashed, flaky, doomed)
    }
    assert statuses == {crashed: "succeeded", flaky: "succeeded", doomed: "dead"}
    overlap_skips = await _count(pool, "schedule_id = $1 AND skip_reason = 'overlap'", ticking)
    ticked = await _count(pool, "schedule_id = $1", ticking)
    succeeded = await _count(pool, "status = 'succeeded'")

    def control_delta(name: str, **labels: str) -> float:
        return _delta(control_before, control_after, name, **labels)

    def worker_delta(name: str, **labels: str) -> float:
        return _delta(worker_before, worker_after, name, **labels)

    assert control_delta("promptsched_leases_reaped_total", outcome="retry") == 1
    assert control_delta("promptsched_leases_reaped_total", outcome="dead") == 0
    assert control_delta("promptsched_dropped_ticks_total", reason="overlap") == overlap_skips
    assert control_delta("promptsched_ticks_total", outcome="skipped") == overlap_skips
    assert control_delta("promptsched_ticks_total", outcome="enqueued") == ticked - overlap_skips
    assert control_delta("promptsched_tick_lag_seconds_count") == ticked - overlap_skips
    assert worker_delta("promptsched_retries_total", provider="echo") == 1
    assert worker_delta("promptsched_dead_letters_total", provider="echo") == 1
    assert worker_delta("promptsched_runs_finished_total", status="dead") == 1
    assert worker_delta("promptsched_runs_finished_total", status="succeeded") == succeeded
    failed = worker_delta(
        "promptsched_run_duration_seconds_count", provider="echo", outcome="failed"
    )
    assert failed == 2
    # The leader's gauges came back to an empty queue; the workers export none of them.
    assert _get(worker_after, "promptsched_stats_leader") == 0
    assert not [key for key in worker_after if key[0] == "promptsched_queue_depth"]


def test_the_metric_label_words_are_the_ledger_words() -> None:
    # metrics.py imports nothing of ours, so its tuples repeat words domain.py and the schema
    # define: they must not drift (a new channel or outcome gets its series at 0 too).
    finished = {status.value for status in RunStatus if status.finished}
    assert set(metric_words.FINAL_STATUSES) == finished
    assert set(metric_words.DELIVERY_OUTCOMES) == {outcome.label for outcome in DeliveryOutcome}
    schema = (ROOT / "promptsched" / "store" / "sql" / "schema.sql").read_text()
    check = re.search(r"outbox_channel_check CHECK \(\(channel = ANY \(ARRAY\[(.*?)\]", schema)
    assert check is not None
    assert set(metric_words.CHANNELS) == set(re.findall(r"'(\w+)'::text", check[1]))
