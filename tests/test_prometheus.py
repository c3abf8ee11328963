"""The signals in a real Prometheus: two real replicas scraped every second by Debian's
Prometheus with the alert rules loaded, a healthy busy load during which no alert fires, then
retries, dead runs, failing webhooks, an overlap skip, a SIGKILL and a replacement replica that
drops the ticks a paused schedule missed before its first scrape. The alerts that should fire
do within their ``for:``, every dashboard query returns data (or is empty for a reason named
here), and ``promtool check metrics`` accepts a real scrape.

The rules are a test-only copy of deploy/alerts.yml with every duration divided by 60 (a
``[15m]`` window is 15s, ``for: 2m`` is 2s, the first-event rule's 900 seconds are 15), so an
alert's minutes pass in seconds; thresholds stay as written."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest
import yaml

from promptsched import netguard
from promptsched.metrics import PROVIDERS, Metrics
from promptsched.ops import notify_targets
from tests import factories
from tests.fakes.http_sink import Reply, start_http_sink
from tests.helpers import Service, free_port, wait_until
from tests.test_alerts import ALERTS, promtool
from tests.test_observability import DASHBOARD, _walk

pytestmark = pytest.mark.slow

SCALE = 60  # every duration of the rules, divided
JOB = "promptsched"
ENV = {
    "PROMPTSCHED_WORKERS": "4",
    "PROMPTSCHED_PROVIDERS": "echo",
    "PROMPTSCHED_PRICES": "echo=1/1",
    "PROMPTSCHED_PROVIDER_ECHO_MAX_CONCURRENCY": "6",  # fleet-wide: in flight, breaker, held
    "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32",
}
LOOPBACK = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)
# Dashboard queries that may come back empty in this scenario, and why.
EMPTY_FOR_A_REASON: dict[str, str] = {}


def prometheus_binary() -> str:
    path = os.environ.get("PROMPTSCHED_PROMETHEUS", "/usr/bin/prometheus")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no Prometheus at {path}: `make test` installs Debian's prometheus package "
            "(or set PROMPTSCHED_PROMETHEUS)"
        )
    return path


def _seconds(text: str) -> int:
    number, unit = int(text[:-1]), text[-1]
    return number * {"s": 1, "m": 60, "h": 3600}[unit]


def scaled_rules() -> dict[str, Any]:
    """deploy/alerts.yml with its windows, ``for:`` and first-event seconds divided by SCALE."""

    def window(match: re.Match[str]) -> str:
        return f"[{max(1, _seconds(match[1]) // SCALE)}s]"

    def since_start(match: re.Match[str]) -> str:
        return f"{match[1]}{max(1, int(match[2]) // SCALE)}"

    rules: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            expr = re.sub(r"\[(\d+[smh])\]", window, rule["expr"])
            rule["expr"] = re.sub(r"(process_start_time_seconds\s*<\s*)(\d+)", since_start, expr)
            if "for" in rule:
                rule["for"] = f"{max(1, _seconds(rule['for']) // SCALE)}s"
    return rules


class Prometheus:
    """A real Prometheus scraping the file-discovered targets every second."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.targets = workdir / "targets.json"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, targets: list[str]) -> None:
        (self.workdir / "rules.yml").write_text(yaml.safe_dump(scaled_rules()))
        self.set_targets(targets)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.workdir / "rules.yml")],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}],
                }
            ],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = open(self.workdir / "prometheus.log", "ab")
        self.process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def set_targets(self, targets: list[str]) -> None:
        written = self.targets.with_suffix(".tmp")
        written.write_text(json.dumps([{"targets": targets}]))
        written.rename(self.targets)  # file discovery never reads a half-written file

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None:
            self._log.close()

    async def get(self, path: str, **params: str) -> Any:
        async with aiohttp.ClientSession() as session:
            async with session.get(self.url + path, params=params) as response:
                body = await response.json()
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    async def firing(self) -> set[tuple[str, frozenset[tuple[str, str]]]]:
        alerts = (await self.get("/api/v1/alerts"))["alerts"]
        return {
            (alert["labels"]["alertname"], frozenset(alert["labels"].items()))
            for alert in alerts
            if alert["state"] == "firing"
        }


@asynccontextmanager
async def prometheus(workdir: Path, targets: list[str]) -> AsyncIterator[Prometheus]:
    server = Prometheus(workdir)
    try:
        server.start(targets)

        async def ready() -> bool:
            try:
                async with aiohttp.ClientSession() as session:
                    async with session.get(server.url + "/-/ready") as response:
                        return response.status == 200
            except aiohttp.ClientError:
                assert server.process is not None and server.process.poll() is None, (
                    workdir / "prometheus.log"
                ).read_text()
                return False

        await wait_until(ready, timeout=30, interval=0.2, what="Prometheus to be ready")
        yield server
    finally:
        server.stop()


def _address(service: Service) -> str:
    event = service.has_event("api.listening")
    assert event is not None
    return f"127.0.0.1:{event['port']}"


async def _scrape(service: Service) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{_address(service)}/metrics") as response:
            assert response.status == 200
            return await response.text()


async def _notify(pool: asyncpg.Pool[Any], schedule_id: int, url: str) -> None:
    raw = {"on_success": True, "on_failure": True, "webhook": {"url": url}}
    notify = notify_targets.validate_targets(raw, allow=LOOPBACK)
    await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", schedule_id, notify)


async def _notifying_run(pool: asyncpg.Pool[Any], url: str, **schedule: Any) -> int:
    sid = await factories.schedule(pool, next_fire_at=None, **schedule)
    await _notify(pool, sid, url)
    return await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")


def _alert(name: str, **labels: str) -> tuple[str, dict[str, str]]:
    return name, labels


async def _fires(server: Prometheus, name: str, labels: dict[str, str], within: float) -> None:
    async def fired() -> bool:
        return any(
            alert == name and set(labels.items()) <= set(found)
            for alert, found in await server.firing()
        )

    await wait_until(fired, timeout=within, interval=0.25, what=f"{name} {labels} to fire")


async def test_signals_hold_in_a_real_prometheus(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    started = time.monotonic()
    rules = {rule["alert"]: rule for g in scaled_rules()["groups"] for rule in g["rules"]}
    # a: the survivor, with neither scheduler nor workers; b: every role, SIGKILLed later;
    # c: b's replacement.
    a = Service(dsn, tmp_path / "a.log", env={**ENV, "PROMPTSCHED_ROLES": "api,reaper,notifier"})
    b = Service(dsn, tmp_path / "b.log", env=ENV)
    c: Service | None = None
    async with start_http_sink() as good, start_http_sink() as bad:
        bad.default = Reply(status=410, body="gone")  # permanent: the notification goes dead
        bad.script(Reply(status=503, body="busy"))  # after one retry
        try:
            await asyncio.gather(a.ready(), b.ready())
            async with prometheus(tmp_path, [_address(a), _address(b)]) as server:
                await _healthy_part(pool, server, good.url)
                await _faults(dsn, pool, server, a, b, tmp_path, bad.url, rules)
                c = Service(dsn, tmp_path / "c.log", env=ENV)
                await _replacement(pool, server, a, b, c, rules)
                await _every_panel_answers(server)
                await _scrapes_pass_promtool_and_stay_bounded(a, c)
        finally:
            for service in (a, b, c):
                if service is not None:
                    service.stop()
    assert time.monotonic() - started < 120, "keep this test lean"


async def _healthy_part(pool: asyncpg.Pool[Any], server: Prometheus, url: str) -> None:
    """A busy, healthy fleet: a per-second schedule whose runs succeed and notify a webhook
    that answers 200. No alert may fire over the longest scaled ``for:`` (15s)."""
    busy = await factories.ticking_schedule(pool, params={"latency": "100ms"})
    await _notify(pool, busy, url)

    async def scraped_and_led() -> bool:
        up = await server.query(f'sum(up{{job="{JOB}"}})')
        leaders = await server.query("sum(promptsched_stats_leader)")
        delivered = await server.query('sum(promptsched_deliveries_total{outcome="delivered"}) > 0')
        led = bool(leaders and leaders[0]["value"][1] == "1")
        # Before its first scrapes, Prometheus's own first evaluations find the gauges absent
        # (PromptschedNoSchedulerAlive, PromptschedNoStatsLeader): the healthy window starts
        # once those have resolved.
        quiet = not await server.firing()
        return bool(up and up[0]["value"][1] == "2" and led and delivered and quiet)

    await wait_until(scraped_and_led, timeout=40, interval=0.25, what="a busy scraped fleet")
    deadline = time.monotonic() + 16
    while time.monotonic() < deadline:
        assert await server.firing() == set(), "an alert fired on a healthy fleet"
        await asyncio.sleep(0.5)
    await pool.execute("UPDATE schedules SET enabled = false WHERE id = $1", busy)


async def _faults(
    dsn: str,
    pool: asyncpg.Pool[Any],
    server: Prometheus,
    a: Service,
    b: Service,
    tmp_path: Path,
    bad_url: str,
    rules: dict[str, Any],
) -> None:
    """Retries, a dead run whose notification goes dead after a retry, overlap skips, and b
    SIGKILLed while it holds a run (a reaps it)."""
    await _notifying_run(pool, bad_url, params={"fail_attempts": 9}, max_attempts=1)
    retried = await factories.schedule(pool, next_fire_at=None, params={"fail_attempts": 1})
    await factories.pending_run(pool, retried, await pool.fetchval("SELECT now()"), "manual")
    overlapping = await factories.ticking_schedule(
        pool, params={"latency": "2500ms"}, overlap="skip"
    )
    held = await factories.schedule(pool, next_fire_at=None, params={"latency": "30s"})
    held_run = await factories.pending_run(
        pool, held, await pool.fetchval("SELECT now()"), "manual"
    )

    async def held_by_b() -> bool:
        holder = await pool.fetchval("SELECT worker_id FROM runs WHERE id = $1", held_run)
        return str(holder).endswith(f":{b.pid}")

    async def b_skipped_overlaps() -> bool:
        where = "schedule_id = $1 AND skip_reason = 'overlap'"
        return bool(
            await pool.fetchval(f"SELECT count(*) >= 2 FROM runs WHERE {where}", overlapping)
        )

    await wait_until(held_by_b, timeout=20, what="b to claim the long run")
    await wait_until(b_skipped_overlaps, timeout=20, what="two overlap skips")
    await pool.execute("UPDATE schedules SET enabled = false WHERE id = $1", overlapping)
    for name, labels in (
        _alert("PromptschedDeadLetters"),
        _alert("PromptschedNotificationsDead", channel="webhook"),
    ):
        await _fires(server, name, labels, within=_seconds(rules[name].get("for", "0s")) + 20)
    b.signal(signal.SIGKILL)
    b.process.wait(10)

    async def reaped() -> bool:
        status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", held_run)
        return bool(status != "running")

    await wait_until(reaped, timeout=20, what="a to reap b's lease")
    down = _alert("PromptschedReplicaDown", instance=_address(b))
    await _fires(server, *down, within=_seconds(rules["PromptschedReplicaDown"]["for"]) + 15)


async def _replacement(
    pool: asyncpg.Pool[Any],
    server: Prometheus,
    a: Service,
    b: Service,
    c: Service,
    rules: dict[str, Any],
) -> None:
    """A schedule paused past its misfire grace comes back while no scheduler runs; c starts,
    drops its missed ticks in its first loop, and only then is discovered by Prometheus: its
    first scrape already holds them, and PromptschedTicksDropped still fires."""
    hour_ago = await pool.fetchval("SELECT date_trunc('minute', now()) - interval '1 hour'")
    stale = await factories.schedule(
        pool, expression="* * * * *", next_fire_at=hour_ago, misfire="skip"
    )
    await c.ready()

    async def dropped() -> bool:
        where = "schedule_id = $1 AND skip_reason = 'misfire'"
        return bool(await pool.fetchval(f"SELECT count(*) FROM runs WHERE {where}", stale))

    await wait_until(dropped, timeout=20, what="c to drop the missed ticks")
    server.set_targets([_address(a), _address(b), _address(c)])
    name = "PromptschedTicksDropped"
    await _fires(server, name, {"reason": "misfire"}, within=20)
    # The path taken: c's series was born holding the drops (no 0 before it in Prometheus).
    first = await server.get(
        "/api/v1/query",
        query=f'promptsched_dropped_ticks_total{{instance="{_address(c)}", reason="misfire"}}[1m]',
    )
    assert float(first["result"][0]["values"][0][1]) > 0


async def _every_panel_answers(server: Prometheus) -> None:
    """Every dashboard query returns data. The queue row's gauges come from the stats leader
    alone, and b (SIGKILLed) may have been it: they are back once its term has run out and a
    or c has taken the duty and refreshed them, so the check is repeated until then (bounded);
    a query still empty at the deadline fails the test."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        (
            expr,
            expr.replace("$__rate_interval", "30s")
            .replace('"$job"', f'"{JOB}"')
            .replace('"$instance"', '".*"'),
        )
        for key, expr in _walk(dashboard["panels"])
        if key == "expr"
    ]
    deadline = time.monotonic() + 45
    while True:
        empty = [expr for expr, query in queries if not await server.query(query)]
        if set(empty) == set(EMPTY_FOR_A_REASON) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert set(empty) == set(EMPTY_FOR_A_REASON), empty


async def _scrapes_pass_promtool_and_stay_bounded(*services: Service) -> None:
    known = Metrics()
    known.know({"echo": ("default",)})
    for service in services:
        text = await _scrape(service)
        checked = await anyio.run_process(
            [promtool(), "check", "metrics"], input=text.encode(), check=False
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "_created" not in text
        _within_domains(known, text)


def _within_domains(known: Metrics, text: str) -> None:
    """Every exported label value is one the metric declares (bounded labels, live)."""
    allowed: dict[tuple[str, str], set[str]] = {}
    for metric, (labels, _) in known.domains.items():
        for label, values in labels.items():
            name = metric._name
            if isinstance(values, tuple):
                allowed[name, label] = set(values)
            elif values == PROVIDERS:
                allowed[name, label] = {"echo"}
    stray = []
    for line in text.splitlines():
        match = re.match(r"(promptsched_\w+?)(_total|_bucket|_sum|_count)?\{(.*)\}", line)
        if not match:
            continue
        for label, value in re.findall(r'(\w+)="([^"]*)"', match[3]):
            wanted = allowed.get((match[1], label))
            if wanted is not None and value not in wanted:
                stray.append(line)
    assert stray == []
