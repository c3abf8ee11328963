"""Real LLM traffic pushes back (docs/providers.md, "When the provider pushes back"): two real
``promptsched run`` replicas against a real LiteLLM proxy (tests/litellm_support.py: a key
limited to 3 requests per 2 s answering 429 with Retry-After, a deployment limited per minute
answering 429 without it, a wrong key answering 401), and header pacing against a server of
ours that sends the real OpenAI header names (the proxy does not pass them on)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from promptsched.executors.settings import DEFAULT_MAX_CONCURRENCY
from tests import litellm_support
from tests.fakes import openai_server as fake_server
from tests.helpers import Service, wait_until

pytestmark = pytest.mark.slow


def _env(proxy_url: str, providers: dict[str, tuple[str, str]], **extra: str) -> dict[str, str]:
    """openai-kind providers on the proxy: name -> (API key, model)."""
    env = {"PROMPTSCHED_PROVIDERS": ",".join(providers), "PROMPTSCHED_RETRY_BASE": "200ms"}
    for name, (key, model) in providers.items():
        upper = name.upper()
        env[f"PROMPTSCHED_PROVIDER_{upper}_KIND"] = "openai"
        env[f"PROMPTSCHED_PROVIDER_{upper}_BASE_URL"] = proxy_url
        env[f"PROMPTSCHED_PROVIDER_{upper}_MODEL"] = model
        env[f"PROMPTSCHED_PROVIDER_{upper}_API_KEY_ENV"] = f"KEY_{upper}"
        env[f"KEY_{upper}"] = key
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[litellm_support.LiteLLMProxy]:
    running = litellm_support.LiteLLMProxy(tmp_path_factory.mktemp("litellm"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def live_proxy(
    proxy: litellm_support.LiteLLMProxy,
) -> AsyncIterator[litellm_support.LiteLLMProxy]:
    await proxy.ready()
    yield proxy


async def _replicas(dsn: str, tmp_path: Path, env: dict[str, str]) -> list[Service]:
    replicas = [
        Service(dsn, tmp_path / f"replica-{i}.log", env=env, args=("--workers", "8"))
        for i in range(2)
    ]
    for replica in replicas:
        await replica.ready()
    return replicas


async def _burst(
    pool: asyncpg.Pool[Any], provider: str, count: int, *, fallback: list[str] | None = None,
    give_up_after: str = "1 hour", max_attempts: int = 1,
) -> int:  # fmt: skip
    """``count`` runs due now (a backfill's worth) of a new schedule, every replica woken."""
    sid: int = await pool.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt, provider, enabled, next_fire_at,"
        " max_attempts, give_up_after, fallback) VALUES ($1 || ' ' || (SELECT count(*) + 1"
        " FROM schedules), 'cron', '0 0 1 1 *', 'hello', $1, true, NULL, $2, $3::text::interval,"
        " $4) RETURNING id",  # a provider's bursts named apart: names are unique per owner
        provider, max_attempts, give_up_after, fallback or [],
    )  # fmt: skip
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT $1, now() - make_interval(secs => g), 'backfill', $2, $3, now() "
        "FROM generate_series(1, $4) AS g",
        sid, provider, max_attempts, count,
    )  # fmt: skip
    await pool.execute("SELECT pg_notify('promptsched_runs', 'rush')")
    return sid


async def _settled(pool: asyncpg.Pool[Any], sid: int, count: int, timeout: float) -> None:
    async def done() -> bool:
        finished: int = await pool.fetchval(
            "SELECT count(*) FROM runs WHERE schedule_id = $1 AND finished_at IS NOT NULL", sid
        )
        return finished == count

    await wait_until(done, timeout=timeout, interval=0.2, what=f"{count} runs finished")


async def _statuses(pool: asyncpg.Pool[Any], sid: int) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT status, count(*) AS n FROM runs WHERE schedule_id = $1 GROUP BY status", sid
    )
    return {row["status"]: row["n"] for row in rows}


async def _attempts(pool: asyncpg.Pool[Any], sid: int) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT a.* FROM run_attempts a JOIN runs r ON r.id = a.run_id "
        "WHERE r.schedule_id = $1 ORDER BY a.run_id, a.number",
        sid,
    )


async def _metric(replicas: list[Service], name: str, **labels: str) -> float:
    """The sum over the replicas of one series of their /metrics."""
    total = 0.0
    for replica in replicas:
        port = (await replica.wait_event("api.listening"))["port"]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as reply:
                text = await reply.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
    return total


async def test_a_burst_against_a_key_limit_ends_with_no_dead_run(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, live_proxy: litellm_support.LiteLLMProxy
) -> None:
    """30 runs, each allowed ONE counted attempt, against a key allowed 3 requests per 2 s: every
    run succeeds (without throttling counted apart, a run's first 429 would kill it), no retry
    comes sooner than its Retry-After, and the breaker closes within one window of the last
    throttling answer."""
    before = len(live_proxy.statuses())
    env = _env(live_proxy.base_url, {"limited": ("sk-limited", "mock")})
    replicas = await _replicas(dsn, tmp_path, env)
    try:
        sid = await _burst(pool, "limited", 30)
        await _settled(pool, sid, 30, timeout=90)
        throttled_metric = await _metric(
            replicas, "promptsched_provider_throttled_attempts_total", provider="limited"
        )
    finally:
        for replica in replicas:
            replica.stop()
    assert await _statuses(pool, sid) == {"succeeded": 30}
    attempts = await _attempts(pool, sid)
    throttled = [a for a in attempts if a["throttled"]]
    assert throttled and all(a["provider"] == "limited" for a in attempts)
    assert throttled_metric == len(throttled)
    window = float(litellm_support.WINDOW)
    for earlier, later in zip(attempts, attempts[1:], strict=False):
        if earlier["run_id"] == later["run_id"] and earlier["throttled"]:
            assert earlier["wait"].total_seconds() >= window
            gap = (later["started_at"] - earlier["finished_at"]).total_seconds()
            assert gap >= window, (earlier, later)  # no retry sooner than its Retry-After
    # The breaker closed within one window of the last throttling answer: a request went
    # out again (the probe) no later than that.
    last = max(a["finished_at"] for a in throttled)
    after = [a["started_at"] for a in attempts if a["started_at"] > last]
    assert after and (min(after) - last).total_seconds() <= window + 1.0
    statuses = live_proxy.statuses()[before:]
    rejected = statuses.count(429)
    assert statuses.count(200) == 30 and rejected == len(throttled)
    # The fleet learns the allowance (3 per window) at the probe and paces to it
    # (docs/providers.md, "Learning the rate"). The first burst is every request sent before
    # the first 429 came back: 8 at once (the default max_concurrency), and one more for each
    # success answered sooner, whose slot and permit went back with its answer; the proxy lets
    # 3 of them through. After it, one throttled request per doubling of the allowance: every
    # three clean windows and the throttle's own. Measured: 8 or 9 in the first burst, 2 or 3
    # after it; the ramp alone met 26.
    timeline = sorted((a["started_at"], a["finished_at"], a["throttled"]) for a in attempts)
    first_answer = min(finished for _, finished, was_throttled in timeline if was_throttled)
    burst = [a for a in timeline if a[0] < first_answer]
    after_burst = [a for a in timeline if a[0] >= first_answer]
    origin = timeline[0][0]
    shown = " ".join(  # every attempt: started-finished (s), and 429 when throttled
        f"{(s - origin).total_seconds():.3f}-{(f - origin).total_seconds():.3f}{'/429' * t}"
        for s, f, t in timeline
    )
    assert len(burst) <= DEFAULT_MAX_CONCURRENCY + litellm_support.KEY_LIMIT, shown
    span = (after_burst[-1][0] - first_answer).total_seconds() if after_burst else 0.0
    late = sum(was_throttled for *_, was_throttled in after_burst)
    assert late <= math.ceil(span / (4 * window)), f"{late} 429s in {span:.1f} s: {shown}"
    print(f"first burst {len(burst)}, 429s after it {late} in {span:.1f} s")


async def test_a_per_minute_limit_without_retry_after_kills_nothing(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, live_proxy: litellm_support.LiteLLMProxy
) -> None:
    """A deployment allowed 3 requests a minute answers 429 without Retry-After: 4 runs of one
    counted attempt each (one more than the minute allows) all succeed within give_up_after
    (3 minutes), throttled meanwhile."""
    env = _env(live_proxy.base_url, {"minute": ("sk-free", "mock-rpm")})
    replicas = await _replicas(dsn, tmp_path, env)
    try:
        sid = await _burst(pool, "minute", 4, give_up_after="3 minutes")
        await _settled(pool, sid, 4, timeout=100)
    finally:
        for replica in replicas:
            replica.stop()
    assert await _statuses(pool, sid) == {"succeeded": 4}
    throttled = [a for a in await _attempts(pool, sid) if a["throttled"]]
    assert throttled and all("No deployments available" in a["error"] for a in throttled)


async def test_give_up_after_ends_a_run_still_throttled(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, live_proxy: litellm_support.LiteLLMProxy
) -> None:
    """A key allowed 1 request per 2 s and 8 runs that may stay throttled for 3 s: the ones
    still throttled then are dead, saying so; none died sooner, none spent a counted
    attempt."""
    env = _env(live_proxy.base_url, {"tiny": ("sk-tiny", "mock")})
    replicas = await _replicas(dsn, tmp_path, env)
    try:
        sid = await _burst(pool, "tiny", 8, give_up_after="3 seconds", max_attempts=5)
        await _settled(pool, sid, 8, timeout=60)
    finally:
        for replica in replicas:
            replica.stop()
    counts = await _statuses(pool, sid)
    assert counts.get("dead", 0) >= 1 and counts.get("succeeded", 0) >= 1, counts
    dead = await pool.fetch(
        "SELECT error, throttles, attempts, started_at, finished_at FROM runs "
        "WHERE schedule_id = $1 AND status = 'dead'",
        sid,
    )
    for run in dead:
        assert "give_up_after (3s)" in run["error"] and "HTTP 429" in run["error"], run["error"]
        assert run["throttles"] == run["attempts"]  # every attempt throttled, none counted
        assert (run["finished_at"] - run["started_at"]).total_seconds() >= 3.0 - 2.2


async def test_throttled_runs_go_to_the_fallback_and_a_401_does_not(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, live_proxy: litellm_support.LiteLLMProxy
) -> None:
    env = _env(
        live_proxy.base_url,
        {"tiny": ("sk-tiny", "mock"), "backup": ("sk-free", "mock"), "wrong": ("sk-nope", "mock")},
    )
    replicas = await _replicas(dsn, tmp_path, env)
    try:
        sid = await _burst(pool, "tiny", 10, fallback=["backup"])
        await _settled(pool, sid, 10, timeout=60)
        denied = await _burst(pool, "wrong", 2, fallback=["backup"], max_attempts=3)
        await _settled(pool, denied, 2, timeout=30)
        backup_tokens = await _metric(
            replicas, "promptsched_llm_tokens_total", provider="backup", kind="prompt"
        )
        moved = await _metric(
            replicas, "promptsched_provider_fallbacks_total",
            from_provider="tiny", to_provider="backup",
        )  # fmt: skip
    finally:
        for replica in replicas:
            replica.stop()
    assert await _statuses(pool, sid) == {"succeeded": 10}
    attempts = await _attempts(pool, sid)
    winners = [a for a in attempts if a["status"] == "succeeded"]
    on_backup = [a for a in winners if a["provider"] == "backup"]
    assert on_backup and all(a["model"] == "mock" for a in winners)
    assert {a["provider"] for a in attempts} == {"tiny", "backup"}
    # Each run that won on backup moved there from tiny once (after its own 429, or while it
    # waited behind tiny's open breaker), and backup never pushes back.
    assert moved == len(on_backup)
    prompt_on_backup = sum(a["usage"]["prompt_tokens"] for a in on_backup)
    assert backup_tokens == prompt_on_backup > 0  # counted for the provider that answered
    # A wrong key is the user's to fix: dead at once, the fallback never tried.
    assert await _statuses(pool, denied) == {"dead": 2}
    for attempt in await _attempts(pool, denied):
        assert attempt["provider"] == "wrong" and "HTTP 401" in attempt["error"]


async def test_header_pacing_holds_every_replica_until_the_reset(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, fake: fake_server.FakeOpenAI
) -> None:
    """An answer saying ``x-ratelimit-remaining-requests: 0`` with a reset 2 s away: no
    request reaches the provider from either replica before the reset."""
    fake.script(
        fake_server.ok(headers={"x-ratelimit-remaining-requests": "0",
                                "x-ratelimit-reset-requests": "2s"}),
    )  # fmt: skip
    env = {
        "PROMPTSCHED_PROVIDERS": "paced",
        "PROMPTSCHED_PROVIDER_PACED_KIND": "openai",
        "PROMPTSCHED_PROVIDER_PACED_BASE_URL": fake.base_url,
        "PROMPTSCHED_PROVIDER_PACED_MODEL": "gpt-fake",
        # one at a time: nothing is in flight when the paced answer arrives
        "PROMPTSCHED_PROVIDER_PACED_MAX_CONCURRENCY": "1",
    }
    replicas = await _replicas(dsn, tmp_path, env)
    try:
        sid = await _burst(pool, "paced", 4)
        await _settled(pool, sid, 4, timeout=30)
    finally:
        for replica in replicas:
            replica.stop()
    assert await _statuses(pool, sid) == {"succeeded": 4}
    arrivals = [request.at for request in fake.requests]
    assert len(arrivals) == 4
    assert arrivals[1] - arrivals[0] >= 2.0, arrivals  # the reset, measured from the answer
    assert all(b - a < 1.5 for a, b in zip(arrivals[1:], arrivals[2:], strict=False)), arrivals


async def test_runs_waiting_behind_an_open_breaker_go_to_the_fallback_at_once(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, fake: fake_server.FakeOpenAI
) -> None:
    """The primary answers one 429 asking for 30 s, which opens its breaker for the fleet.
    Runs created while it is open: those of a schedule with a fallback run on the fallback
    at once (moved while they wait, not after the probe), each attempt showing it; those of a
    schedule without one wait, and the primary hears nothing more."""
    fake.script(fake_server.rate_limited("30"))
    env = {"PROMPTSCHED_PROVIDERS": "primary,backup", "PROMPTSCHED_RETRY_BASE": "200ms"}
    for name in ("primary", "backup"):
        env[f"PROMPTSCHED_PROVIDER_{name.upper()}_KIND"] = "openai"
        env[f"PROMPTSCHED_PROVIDER_{name.upper()}_BASE_URL"] = fake.base_url
        env[f"PROMPTSCHED_PROVIDER_{name.upper()}_MODEL"] = f"gpt-{name}"
    replicas = await _replicas(dsn, tmp_path, env)
    try:
        await _burst(pool, "primary", 1)  # its 429 opens the breaker for 30 s
        open_until = await wait_until(
            lambda: pool.fetchval(
                "SELECT open_until FROM provider_buckets "
                "WHERE provider = 'primary' AND open_until > now()"
            ),
            timeout=15, interval=0.1, what="the primary's breaker open",
        )  # fmt: skip
        sid = await _burst(pool, "primary", 6, fallback=["backup"])
        waiting = await _burst(pool, "primary", 2)
        await _settled(pool, sid, 6, timeout=15)
        moved = await _metric(
            replicas, "promptsched_provider_fallbacks_total",
            from_provider="primary", to_provider="backup",
        )  # fmt: skip
        still = await pool.fetch(
            "SELECT status, attempts, provider FROM runs WHERE schedule_id = $1", waiting
        )
    finally:
        for replica in replicas:
            replica.stop()
    assert await _statuses(pool, sid) == {"succeeded": 6}
    attempts = await _attempts(pool, sid)
    assert len(attempts) == 6 and moved == 6
    for attempt in attempts:
        assert attempt["provider"] == "backup" and attempt["model"] == "gpt-backup", attempt
        assert attempt["finished_at"] < open_until  # not after the primary's cool-down
    # Without a fallback, a run waits for the breaker; the primary heard only the one 429.
    assert [(r["status"], r["attempts"], r["provider"]) for r in still] == [
        ("pending", 0, "primary")
    ] * 2
    models = [request.json["model"] for request in fake.requests]
    assert models.count("gpt-primary") == 1 and models.count("gpt-backup") == 6, models


async def test_a_run_throttled_when_nothing_else_was_pending_is_retried_when_asked(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, fake: fake_server.FakeOpenAI
) -> None:
    """The worker's claim took the provider's only run, so it asks that provider again only
    when its next run is due (or after its idle sleep, 30 s here). The run's answer is a 429
    asking for 1 s: the retry goes out about 1 s later, not when the idle sleep ends (the
    burst test met this at the end of a burst as a probe 5 s late, the default sleep)."""
    fake.script(fake_server.rate_limited("1"))
    env = {
        "PROMPTSCHED_PROVIDERS": "solo",
        "PROMPTSCHED_PROVIDER_SOLO_KIND": "openai",
        "PROMPTSCHED_PROVIDER_SOLO_BASE_URL": fake.base_url,
        "PROMPTSCHED_PROVIDER_SOLO_MODEL": "gpt-fake",
        "PROMPTSCHED_WORKER_MAX_SLEEP": "30s",
    }
    service = Service(dsn, tmp_path / "solo.log", env=env, args=("--workers", "8"))
    try:
        await service.ready()
        sid = await _burst(pool, "solo", 1)
        await _settled(pool, sid, 1, timeout=15)
    finally:
        service.stop()
    assert await _statuses(pool, sid) == {"succeeded": 1}
    arrivals = [request.at for request in fake.requests]
    assert len(arrivals) == 2, arrivals
    assert 1.0 <= arrivals[1] - arrivals[0] < 5.0, arrivals  # as asked, not the idle sleep
