"""Provider limits hold for the whole fleet (issue 19, part 1), with real ``promptsched run``
processes against a fake OpenAI-compatible server on loopback that counts what it receives:
three replicas never send more than the provider's ``MAX_CONCURRENCY`` at once over a rush,
also while one is SIGKILLed and restarted, and never more than its ``RATE`` allows in any
window, and never more LLM tokens than its ``TOKENS_PER_MINUTE`` paces. Each replica alone
would allow the full limit (the per-process cap is the same number), so without the
coordination in Postgres these tests see about three times the limit.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import openai_server as fake_server
from tests.helpers import Service, wait_until
from tests.test_providers_integration import PROVIDER, provider_env

pytestmark = pytest.mark.slow

LIMIT = 8
RUSH = 240


async def _schedule(pool: asyncpg.Pool[Any]) -> int:
    sid: int = await pool.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt, provider, enabled, next_fire_at) "
        "VALUES ('rush', 'cron', '0 0 1 1 *', 'hello', $1, true, NULL) RETURNING id",
        PROVIDER,
    )
    return sid


async def _rush(pool: asyncpg.Pool[Any], sid: int, count: int) -> None:
    """``count`` runs due now, as a backfill or a burst of triggers would leave them."""
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT $1, now() - make_interval(secs => g), 'backfill', $2, 3, now() "
        "FROM generate_series(1, $3) AS g",
        sid,
        PROVIDER,
        count,
    )
    await pool.execute("SELECT pg_notify('promptsched_runs', 'rush')")  # every replica wakes


async def _succeeded(pool: asyncpg.Pool[Any]) -> int:
    done: int = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'")
    return done


async def _throttled(replica: Service, reason: str) -> float:
    """The replica's ``promptsched_provider_throttled_claims_total`` for ``reason``."""
    port = (await replica.wait_event("api.listening"))["port"]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as reply:
            text = await reply.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "promptsched_provider_throttled_claims_total"
                    and sample.labels.get("reason") == reason):  # fmt: skip
                return float(sample.value)
    return 0.0


def _replicas(dsn: str, tmp_path: Path, env: dict[str, str], count: int = 3) -> list[Service]:
    return [
        Service(dsn, tmp_path / f"replica-{i}.log", env=env, args=("--workers", "16"))
        for i in range(count)
    ]


@contextlib.asynccontextmanager
async def _drained_by_replicas(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, env: dict[str, str], runs: int
) -> AsyncIterator[list[Service]]:
    """Three replicas drain a rush of ``runs``; the block runs while they are still up."""
    sid = await _schedule(pool)
    replicas = _replicas(dsn, tmp_path, env)
    try:
        for replica in replicas:
            await replica.ready()
        await _rush(pool, sid, runs)

        async def all_done() -> bool:
            return await _succeeded(pool) == runs

        await wait_until(all_done, timeout=60, what="every run")
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


async def test_three_replicas_never_exceed_the_providers_concurrency(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, fake: fake_server.FakeOpenAI
) -> None:
    fake.default = fake_server.slow(0.15)  # requests overlap: concurrency is what binds
    env = provider_env(fake.base_url, max_concurrency=str(LIMIT), timeout="30s")
    sid = await _schedule(pool)
    replicas = _replicas(dsn, tmp_path, env)
    try:
        for replica in replicas:
            await replica.ready()
        await _rush(pool, sid, RUSH)

        async def a_third_done() -> bool:
            return await _succeeded(pool) >= RUSH // 3

        await wait_until(a_third_done, timeout=60, what="a third of the rush")
        replicas[0].signal(signal.SIGKILL)  # its running runs count until the reaper has them
        replicas[0].stop()  # reaps the killed process
        replicas[0] = Service(dsn, tmp_path / "replica-0b.log", env=env, args=("--workers", "16"))
        await replicas[0].ready()

        async def all_done() -> bool:
            return await _succeeded(pool) == RUSH

        await wait_until(all_done, timeout=120, what="the whole rush")
        # The limit, not a lack of takers, is what held them: replicas were turned away.
        held_back = [await _throttled(replica, "concurrency") for replica in replicas]
        assert sum(held_back) >= 1, held_back
    finally:
        for replica in replicas:
            replica.stop()
    assert len(fake.requests) >= RUSH
    assert fake.max_in_flight <= LIMIT, fake.max_in_flight
    assert fake.max_in_flight >= LIMIT - 2  # the limit was used, not just never reached


async def test_three_replicas_share_the_providers_request_rate(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, fake: fake_server.FakeOpenAI
) -> None:
    rate, runs = 5, 40
    env = provider_env(fake.base_url, rate=str(rate), timeout="30s")
    async with _drained_by_replicas(dsn, pool, tmp_path, env, runs):
        pass
    times = sorted(r.at for r in fake.requests)
    assert len(times) == runs
    # A token bucket of one second's worth (5) refilled at 5/s admits at most 5 + 5 * w in
    # any window of w seconds; 0.3 s of slack for the time between a claim and its request
    # (three replicas with a bucket each would send 15 at once).
    window = 0.5
    for i, start in enumerate(times):
        inside = sum(1 for t in times[i:] if t - start <= window)
        assert inside <= rate + rate * (window + 0.3), (start - times[0], inside)
    assert times[-1] - times[0] >= (runs - rate) / rate - 0.5


async def test_three_replicas_share_the_providers_tokens_per_minute(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, fake: fake_server.FakeOpenAI
) -> None:
    # 100 tokens a request and 30,000 tokens a minute: 500 tokens (5 requests) a second, and
    # at most one second's worth in the bucket. A run's tokens are known once it ran, so the
    # bucket may go below zero by the runs in flight: at most MAX_CONCURRENCY of them.
    used, tpm, in_flight, runs = 100, 30_000, 2, 40
    fake.default = fake_server.ok(
        usage={"prompt_tokens": 70, "completion_tokens": 30, "total_tokens": used}
    )
    env = provider_env(
        fake.base_url, tokens_per_minute=str(tpm), max_concurrency=str(in_flight), timeout="30s"
    )
    async with _drained_by_replicas(dsn, pool, tmp_path, env, runs) as replicas:
        held_back = [await _throttled(replica, "tokens") for replica in replicas]
    assert sum(held_back) >= 1, held_back
    assert await pool.fetchval("SELECT sum(tokens) FROM runs") == runs * used
    times = sorted(r.at for r in fake.requests)
    assert len(times) == runs
    # In any window of w seconds the fleet sends at most the bucket (one second's worth), w
    # seconds of refill, and what the runs in flight spent before their tokens were counted
    # (twice: before the window and inside it), with 0.3 s of slack between a claim and its
    # request. Three replicas with a bucket each would send three times as much.
    per_second, window = tpm / 60, 2.0
    bound = per_second + per_second * (window + 0.3) + 2 * in_flight * used
    for i, start in enumerate(times):
        inside = used * sum(1 for t in times[i:] if t - start <= window)
        assert inside <= bound, (start - times[0], inside, bound)
    # The whole rush is paced at the limit: 4,000 tokens less the first second's worth and
    # what was in flight take at least 6.6 s at 500 a second.
    least = (runs * used - per_second - in_flight * used) / per_second
    assert times[-1] - times[0] >= least - 0.5, (times[-1] - times[0], least)


async def test_a_429_seen_by_one_replica_cools_the_provider_down_for_both(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path, fake: fake_server.FakeOpenAI
) -> None:
    wait = 3.0
    # Enough work for 5 s at full speed: without a shared cool-down it goes on right through
    # the 3 s the provider asked for.
    fake.default = fake_server.slow(0.1)
    fake.script(*[fake_server.slow(0.1)] * 4, fake_server.rate_limited(f"{wait:g}"))
    env = provider_env(fake.base_url, max_concurrency="4", timeout="30s")
    sid = await _schedule(pool)
    replicas = _replicas(dsn, tmp_path, env, count=2)
    runs = 200
    try:
        for replica in replicas:
            await replica.ready()
        await _rush(pool, sid, runs)

        async def all_done() -> bool:
            return await _succeeded(pool) == runs

        await wait_until(all_done, timeout=60, what="every run, after the cool-down")
        # Each replica, the one that met the 429 and the other, held back claims while the
        # breaker was open.
        for replica in replicas:
            assert await _throttled(replica, "open") >= 1, replica.log_path.name
    finally:
        for replica in replicas:
            replica.stop()
    limited = fake.requests[4]
    after = sorted(r.at - limited.at for r in fake.requests if r.at > limited.at)
    # Requests already on their way when the 429 came back may still arrive just after it;
    # then nothing, from either replica, until the provider's Retry-After has passed.
    quiet = [t for t in after if 0.3 < t < wait - 0.1]
    assert quiet == [], quiet
    assert after and after[-1] >= wait - 0.1  # the rest went out after the cool-down
    row = await pool.fetchrow("SELECT open_until, failures FROM provider_buckets")
    assert row is not None and row["open_until"] is None and row["failures"] == 0  # closed again
