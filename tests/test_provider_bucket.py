"""A provider's fleet-wide row (``provider_buckets``, docs/providers.md) over a frozen clock.

The circuit breaker after a run of failures: five retryable failures in a row open it for 30 s;
while open no claim is made; once that has passed one probe goes through at a time
(half-open); a failed probe opens it again for twice as long, a successful one closes it. The
tokens-per-minute bucket: each attempt's reported tokens are taken from it, and no run is
claimed while it is not positive. Time moves by a ``FrozenClock``; the worker pool runs in
drain mode (``run_once``) against a fake OpenAI-compatible server, nothing sleeps."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.metrics import Metrics
from promptsched.roles.worker import fleet as worker_fleet
from promptsched.roles.worker.pool import WorkerPool
from tests import factories
from tests.factories import EPOCH
from tests.fakes import openai_server as fake_server
from tests.helpers import wait_until
from tests.test_providers_integration import PROVIDER, fake_schedule, fake_workers

OPEN_FOR = timedelta(seconds=worker_fleet.BREAKER_BASE)
CLOSED, HALF_OPEN, OPEN = 0, 1, 2


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"provider": PROVIDER, **labels})


def _breaker(metrics: Metrics) -> float | None:
    return _sample(metrics, "promptsched_provider_breaker_state")


def _in_flight(metrics: Metrics) -> float | None:
    return _sample(metrics, "promptsched_provider_in_flight")


def _throttled(metrics: Metrics, reason: str) -> float:
    return _sample(metrics, "promptsched_provider_throttled_claims_total", reason=reason) or 0.0


async def _bucket(pool: asyncpg.Pool[Any]) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT failures, open_until, reason FROM provider_buckets WHERE provider = $1", PROVIDER
    )
    assert row is not None
    return row


async def _running(pool: asyncpg.Pool[Any]) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'running'")
    return count


async def _probe(
    pool: asyncpg.Pool[Any],
    fake: fake_server.FakeOpenAI,
    workers: WorkerPool,
    metrics: Metrics,
    answer: fake_server.Behaviour,
) -> None:
    """One drain while the breaker is half-open, its first request held until the rest of the
    fleet (this pool's further claims) has been turned away: exactly one run is in flight, and
    the gauges say half-open with one in flight."""
    gate = asyncio.Event()
    fake.script(fake_server.gated(gate, answer))
    sent = len(fake.requests)
    held_back = _throttled(metrics, "concurrency")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(workers.run_once)
            await fake.wait_until(lambda server: server.in_flight == 1)

            async def turned_away() -> bool:
                return _throttled(metrics, "concurrency") >= held_back + 2

            # The pool kept claiming while the probe was out, and was refused each time.
            await wait_until(turned_away, timeout=10, what="claims refused during the probe")
            assert len(fake.requests) == sent + 1
            assert await _running(pool) == 1
            assert _breaker(metrics) == HALF_OPEN
            assert _in_flight(metrics) == 1
            gate.set()


async def test_a_run_of_failures_opens_the_breaker_and_probes_decide_what_follows(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    fake.default = fake_server.status(500, '{"error": {"message": "upstream broke"}}')
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    sid = await fake_schedule(pool, max_attempts=20)
    runs = [await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=i)) for i in range(4)]
    async with fake_workers(pool, clock, fake.base_url, metrics=metrics, timeout="30s") as workers:
        # Four retryable failures in a row: counted, still closed.
        assert await workers.run_once() == 4
        row = await _bucket(pool)
        assert (row["failures"], row["open_until"]) == (4, None)
        assert _breaker(metrics) == CLOSED
        assert _throttled(metrics, "open") == 0

        # The fifth opens it for 30 s.
        runs.append(await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=10)))
        assert await workers.run_once() == 1
        row = await _bucket(pool)
        assert (row["failures"], row["open_until"]) == (5, EPOCH + OPEN_FOR)
        assert row["reason"] == "5 failures in a row"
        assert _breaker(metrics) == OPEN
        assert len(fake.requests) == 5

        # While open, runs that are due wait as pending rows: no claim, no request.
        clock.advance(OPEN_FOR - timedelta(seconds=1))
        opened = _throttled(metrics, "open")
        assert await workers.run_once() == 0
        assert _throttled(metrics, "open") > opened
        assert len(fake.requests) == 5
        assert await pool.fetchval(
            "SELECT count(*) FROM runs WHERE status = 'pending' AND available_at <= $1",
            clock.instant,
        ) == 5  # fmt: skip
        assert _breaker(metrics) == OPEN and _in_flight(metrics) == 0

        # Half-open: one probe; it fails, and the breaker opens again for twice as long.
        clock.advance(timedelta(seconds=1))
        await _probe(pool, fake, workers, metrics, fake.default)
        assert len(fake.requests) == 6
        row = await _bucket(pool)
        assert (row["failures"], row["open_until"]) == (6, clock.instant + 2 * OPEN_FOR)
        assert _breaker(metrics) == OPEN

        clock.advance(2 * OPEN_FOR - timedelta(seconds=1))
        assert await workers.run_once() == 0
        assert len(fake.requests) == 6

        # Half-open again: the probe succeeds and closes it; the rest go at once.
        clock.advance(timedelta(seconds=1))
        fake.default = fake_server.ok()
        await _probe(pool, fake, workers, metrics, fake_server.ok())
        row = await _bucket(pool)
        assert (row["failures"], row["open_until"], row["reason"]) == (0, None, None)
        assert _breaker(metrics) == CLOSED
        assert _in_flight(metrics) == 0

    assert len(fake.requests) == 6 + 5
    statuses = await pool.fetch("SELECT status FROM runs WHERE id = ANY($1)", runs)
    assert [row["status"] for row in statuses] == ["succeeded"] * 5


async def test_a_probe_whose_call_returned_counts_until_it_reported(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's permit goes back when it returns, and a limited claim counts out this
    process's runs whose final write is on its way (docs/providers.md, "What the concurrency
    limit counts"); a half-open breaker's probe is passed so only once it reported. Its
    report is held: the call is over, the pool keeps claiming, and no second probe goes out."""
    fake.default = fake_server.status(500, '{"error": {"message": "upstream broke"}}')
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    sid = await fake_schedule(pool, max_attempts=20)
    for i in range(5):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=i))
    gate, reporting = asyncio.Event(), asyncio.Event()
    report = worker_fleet.Fleet.report

    async def held(self: worker_fleet.Fleet, *args: Any) -> None:
        if len(fake.requests) > 5:  # the probe's, not the five failures that open the breaker
            reporting.set()
            await gate.wait()
        await report(self, *args)

    monkeypatch.setattr(worker_fleet.Fleet, "report", held)
    async with fake_workers(pool, clock, fake.base_url, metrics=metrics, timeout="30s") as workers:
        assert await workers.run_once() == 5
        assert _breaker(metrics) == OPEN
        clock.advance(OPEN_FOR)
        fake.default = fake_server.ok()
        held_back = _throttled(metrics, "concurrency")
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(workers.run_once)
                await reporting.wait()
                assert fake.in_flight == 0 and len(fake.requests) == 6  # the probe's call is over

                async def turned_away() -> bool:
                    return _throttled(metrics, "concurrency") >= held_back + 2

                await wait_until(turned_away, timeout=10, what="claims refused while reporting")
                assert len(fake.requests) == 6
                assert await _running(pool) == 1
                gate.set()
        assert _breaker(metrics) == CLOSED
    assert len(fake.requests) == 6 + 4
    succeeded = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'")
    assert succeeded == 5


async def _llm_tokens(pool: asyncpg.Pool[Any]) -> float:
    tokens: float = await pool.fetchval(
        "SELECT llm_tokens FROM provider_buckets WHERE provider = $1", PROVIDER
    )
    return tokens


async def test_no_run_is_claimed_while_the_tokens_per_minute_bucket_is_not_positive(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    # Each request reports 10 tokens; 600 a minute is 10 a second, and the bucket holds one
    # second's worth. One run at a time, so each claim sees the tokens of the one before.
    assert fake_server.DEFAULT_USAGE["total_tokens"] == 10
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    sid = await fake_schedule(pool)
    for i in range(4):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=i))
    async with fake_workers(
        pool, clock, fake.base_url, metrics=metrics, max_concurrency="1",
        tokens_per_minute="600",
    ) as workers:  # fmt: skip
        assert await workers.run_once() == 1  # a full bucket (10) less 10: empty
        assert await _llm_tokens(pool) == 0
        assert _throttled(metrics, "tokens") >= 1  # the next claims took nothing
        assert await workers.run_once() == 0  # not positive: nothing

        clock.advance(timedelta(milliseconds=500))  # 5 tokens back
        assert await workers.run_once() == 1
        assert await _llm_tokens(pool) == -5  # a run's tokens are known once it ran

        clock.advance(timedelta(milliseconds=500))  # back to 0: still not positive
        assert await workers.run_once() == 0
        clock.advance(timedelta(milliseconds=1))
        assert await workers.run_once() == 1
        assert await _llm_tokens(pool) == pytest.approx(0.01 - 10)

        clock.advance(timedelta(seconds=60))  # refilled to one second's worth, no more
        assert await workers.run_once() == 1
        assert await _llm_tokens(pool) == 0
    assert len(fake.requests) == 4
    assert _throttled(metrics, "tokens") >= 4
    assert _throttled(metrics, "concurrency") == _throttled(metrics, "rate") == 0
