"""What each call in flight costs beyond the call (W9, docs/performance.md): a lease is renewed
when it needs it, not at every heartbeat; a provider with nothing pending is not asked at every
claim; a provider's permit goes back when its call returns, and a fleet-wide limit counts
calls in flight, not final writes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.config import WorkerSettings
from promptsched.executors import openai
from promptsched.executors.base import Registry
from promptsched.executors.echo import EchoExecutor
from promptsched.executors.limiter import Limiter
from promptsched.executors.settings import ProviderSettings
from promptsched.metrics import Metrics
from promptsched.prices import Prices
from promptsched.roles.worker import WorkerPool
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.roles.worker.inflight import InFlight
from promptsched.store import queries
from tests import factories
from tests.factories import EPOCH
from tests.fakes import openai_server as fake_server
from tests.helpers import wait_until

LEASE = timedelta(seconds=30)
INTERVAL = timedelta(seconds=10)


async def _lease_of(pool: asyncpg.Pool[Any], run_id: int) -> Any:
    return await pool.fetchval("SELECT lease_expires_at FROM runs WHERE id = $1", run_id)


async def test_a_lease_is_renewed_once_it_is_most_of_an_interval_old(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await factories.schedule(pool)
    for second in range(3):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=second))
    claimed = await queries.run_claim_batch(pool, EPOCH, "echo", 3, "w", LEASE)
    metrics = Metrics()
    heartbeat = Heartbeat(pool, FrozenClock(EPOCH), metrics, lease=LEASE, interval=INTERVAL)
    now = time.monotonic()
    ages = {claimed[0].id: 9.0, claimed[1].id: 7.6, claimed[2].id: 7.4}  # seconds since renewed
    for row in claimed:
        attempt = InFlight(row.id, row.attempt_id, "echo", None)
        attempt.renewed_at = now - ages[row.id]
        heartbeat.inflight.add(attempt)
    # Looks come every quarter interval: what is at least 3/4 of an interval old is due.
    due = heartbeat.due()
    assert sorted(a.run_id for a in due) == sorted([claimed[0].id, claimed[1].id])
    before = {row.id: await _lease_of(pool, row.id) for row in claimed}
    heartbeat.clock = FrozenClock(EPOCH + timedelta(seconds=5))
    await heartbeat.run_within_lease(due)
    after = {row.id: await _lease_of(pool, row.id) for row in claimed}
    assert [after[r.id] > before[r.id] for r in claimed] == [True, True, False]
    assert metrics.leases_renewed._value.get() == 2
    # Just renewed: those two are not due again for another 3/4 of an interval.
    assert [a.run_id for a in heartbeat.due()] == []


async def test_the_heartbeat_loop_renews_a_short_attempt_never_and_a_long_one_in_time(
    pool: asyncpg.Pool[Any],
) -> None:
    """A real loop with a short interval: an attempt younger than 3/4 of it is left alone, an
    older one is renewed at the next look."""
    sid = await factories.schedule(pool)
    for second in range(2):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=second))
    young, old = await queries.run_claim_batch(pool, None, "echo", 2, "w", LEASE)
    metrics = Metrics()
    interval = timedelta(seconds=2)
    heartbeat = Heartbeat(pool, FrozenClock(EPOCH), metrics, lease=LEASE, interval=interval)
    kept = InFlight(young.id, young.attempt_id, "echo", None)  # renewed just now
    aged = InFlight(old.id, old.attempt_id, "echo", None)
    aged.renewed_at = time.monotonic() - 1.6  # 4/5 of the interval: due at the first look
    heartbeat.inflight.add(kept)
    heartbeat.inflight.add(aged)
    leases = {r.id: await _lease_of(pool, r.id) for r in (young, old)}

    async def renewed() -> bool:
        return await _lease_of(pool, old.id) != leases[old.id]

    async with anyio.create_task_group() as tg:
        await tg.start(heartbeat.run)
        await wait_until(renewed, timeout=5, what="the aged lease renewed")
        tg.cancel_scope.cancel()
    # The first look came a quarter interval in: the young attempt was then 0.5 s old.
    assert await _lease_of(pool, young.id) == leases[young.id]
    assert metrics.leases_renewed._value.get() == 1


def _two_provider_pool(
    pool: asyncpg.Pool[Any],
    limiters: dict[str, Limiter],
    slots: int = 4,
    *,
    registry: Registry | None = None,
    worker_id: str = "w",
) -> WorkerPool:
    metrics = Metrics()
    prices = Prices()
    metrics.know(prices.models(list(limiters)))
    clock = FrozenClock(EPOCH)
    return WorkerPool(
        pool,
        clock,
        metrics,
        registry or Registry({name: EchoExecutor() for name in limiters}),
        limiters,
        Heartbeat(pool, clock, metrics, lease=LEASE, interval=INTERVAL),
        WorkerSettings(
            slots=slots,
            worker_id=worker_id,
            retry_base=timedelta(seconds=10),
            retry_max=timedelta(minutes=5),
            prices=prices,
        ),
    )


async def test_a_provider_with_nothing_pending_is_asked_again_only_when_work_may_have_come(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await factories.schedule(pool)
    for second in range(12):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=second))
    asked: list[str] = []
    claim_batch = queries.run_claim_batch

    async def recorded(db: Any, now: Any, provider: str, *args: Any) -> Any:
        asked.append(provider)
        return await claim_batch(db, now, provider, *args)

    monkeypatch.setattr(queries, "run_claim_batch", recorded)
    workers = _two_provider_pool(pool, {"idle": Limiter(100), "echo": Limiter(100)}, slots=4)
    async with anyio.create_task_group() as tg:
        await tg.start(workers.finalizer.run)
        assert await workers.claim() == 4
        assert asked == ["idle", "echo"]  # the first claim asks both; `idle` had nothing
        asked.clear()
        for _ in range(2):  # further claims, as slots free
            await wait_until(lambda: _free(workers), timeout=10, what="a slot to free")
            assert await workers.claim() > 0
        assert asked == ["echo", "echo"]
        # A NOTIFY (new runs somewhere) or a wait that ran out with slots free: asked again.
        asked.clear()
        workers.notify()
        await wait_until(lambda: _free(workers), timeout=10, what="a slot to free")
        await workers.claim()
        assert asked[0] == "idle"
        asked.clear()
        await wait_until(lambda: _free(workers), timeout=10, what="a slot to free")
        await workers.claim()
        assert "idle" not in asked
        # A run of `idle` that becomes available in a moment: once `idle` has been asked and
        # found it not yet due, it is asked again when it is, and the dispatcher's wait ends
        # by then.
        await pool.execute(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
            "VALUES ($1, $2, 'manual', 'idle', 3, $2)",
            sid,
            EPOCH + timedelta(seconds=0.5),
        )
        workers.notify()
        await wait_until(lambda: _free(workers), timeout=10, what="a slot to free")
        asked.clear()
        await workers.claim()
        assert asked[0] == "idle"  # nothing available yet: left out until it is
        assert 0 < await workers.seconds_until_work() <= 0.5
        asked.clear()
        await wait_until(lambda: _free(workers), timeout=10, what="a slot to free")
        await workers.claim()
        assert "idle" not in asked

        async def due_again() -> bool:
            return time.monotonic() >= workers.waiting.drained["idle"]

        await wait_until(due_again, timeout=5, what="the idle run's moment")
        asked.clear()
        await wait_until(lambda: _free(workers), timeout=10, what="a slot to free")
        await workers.claim()
        assert asked[0] == "idle"
        await wait_until(lambda: _idle(workers), timeout=10, what="every attempt over")
        tg.cancel_scope.cancel()


async def _all_succeeded(pool: asyncpg.Pool[Any], count: int) -> bool:
    done: int = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'")
    return done == count


async def _idle(workers: WorkerPool) -> bool:
    return not workers.inflight


async def _free(workers: WorkerPool) -> bool:
    return workers._free_slots() > 0


@pytest.mark.parametrize("fleet", [False, True], ids=["local-limit", "fleet-limit"])
async def test_a_limit_gives_its_permit_back_when_the_call_returns(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch, fleet: bool
) -> None:
    """The final write is held. The permit is back as soon as the call returns, and the next
    run starts meanwhile: a limit of this process bounds its calls in flight, and so does a
    fleet-wide one (the claim does not count this process's runs whose write is on its way)."""
    sid = await factories.schedule(pool)
    for second in range(2):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=second))
    gate = anyio.Event()
    finish_many = queries.run_finish_many
    writing: list[int] = []

    async def held(db: Any, now: Any, batch: Any, worker_id: str) -> set[int]:
        writing.append(len(batch))
        await gate.wait()
        return await finish_many(db, now, batch, worker_id)

    monkeypatch.setattr(queries, "run_finish_many", held)
    limiter = Limiter(1, fleet=fleet)
    workers = _two_provider_pool(pool, {"echo": limiter}, slots=4)

    async def both_writes_held() -> bool:
        # in one batch, or one held and one queued behind it (a second writer takes only a
        # full batch)
        return sum(writing) + workers.finalizer.pending == 2

    async with anyio.create_task_group() as tg:
        tg.start_soon(workers.run_once)
        await wait_until(both_writes_held, timeout=10, what="both calls made, writes held")
        assert limiter.in_use == 0 and len(workers.inflight) == 2
        gate.set()
    assert limiter.in_use == 0
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'") == 2


@asynccontextmanager
async def _fleet_replicas(
    pool: asyncpg.Pool[Any], base_url: str, slots: tuple[int, ...]
) -> AsyncIterator[list[WorkerPool]]:
    """One process's pool per entry of ``slots`` (its slot count), each with an executor of
    its own for the provider ``llm`` at ``base_url``, whose limit of 2 calls holds for the
    whole fleet; the executors are closed on the way out."""
    settings = ProviderSettings(
        name="llm", kind="openai", base_url=base_url, default_model="m",
        request_timeout=timedelta(seconds=30), max_concurrency=2, fleet=True,
    )  # fmt: skip
    executors = [openai.OpenAIExecutor(settings) for _ in slots]
    try:
        yield [
            _two_provider_pool(pool, {"llm": Limiter(2, fleet=True)}, slots=count,
                               registry=Registry({"llm": executor}), worker_id=f"w{n}")
            for n, (count, executor) in enumerate(zip(slots, executors, strict=True))
        ]  # fmt: skip
    finally:
        for executor in executors:
            await executor.aclose()


async def test_the_fleet_limit_counts_calls_in_flight_not_final_writes(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes' pools share a fleet-wide limit of 2 calls at a server that counts them.
    Every final write is held: each run stays `running` until its write commits, yet the
    next calls start as soon as calls return, and the server never sees more than 2 at once
    (each claim discounts only its own process's returned calls, and only while they are
    still running with the attempt it made)."""
    sid = await factories.schedule(pool, prompt="run {{ run_id }}")
    await pool.execute("UPDATE schedules SET provider = 'llm' WHERE id = $1", sid)
    runs = [await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=n)) for n in range(8)]
    gate = anyio.Event()
    finish_many = queries.run_finish_many
    writing: list[int] = []

    async def held(db: Any, now: Any, batch: Any, worker_id: str) -> set[int]:
        writing.extend(item.run_id for item in batch)
        await gate.wait()
        return await finish_many(db, now, batch, worker_id)

    monkeypatch.setattr(queries, "run_finish_many", held)

    async def every_call_made() -> bool:
        return len(fake.requests) == 8 and fake.in_flight == 0

    async with fake_server.start_fake_openai(default=fake_server.slow(0.05)) as fake:
        async with _fleet_replicas(pool, fake.base_url, (4, 4)) as replicas:
            async with anyio.create_task_group() as tg:
                for replica in replicas:
                    await tg.start(replica.run)
                await wait_until(every_call_made, timeout=20, what="8 calls, writes held")
                running = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'running'")
                assert running == 8  # all 8 calls were made, and none of the writes committed
                gate.set()
                await wait_until(lambda: _all_succeeded(pool, 8), timeout=20, what="8 writes")
                tg.cancel_scope.cancel()
    assert fake.max_in_flight == 2  # the limit was used, never exceeded
    prompts = sorted(request.json["messages"][-1]["content"] for request in fake.requests)
    assert prompts == sorted(f"run {rid}" for rid in runs)  # each run called once
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'") == 8


def _refused(workers: WorkerPool) -> float:
    refused = workers.metrics.registry.get_sample_value(
        "promptsched_provider_throttled_claims_total",
        {"provider": "llm", "reason": "concurrency"},
    )
    return refused or 0.0


async def test_a_claim_never_counts_out_a_call_still_in_flight(pool: asyncpg.Pool[Any]) -> None:
    """Two processes share a fleet-wide limit of 2, one call each at the server, both held. The
    second process has free slots and a free permit of its own, and keeps claiming: its own
    call is still in flight, so it counts, and the server never sees a third call."""
    sid = await factories.schedule(pool)
    await pool.execute("UPDATE schedules SET provider = 'llm' WHERE id = $1", sid)
    await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=10))
    gate = asyncio.Event()
    async with fake_server.start_fake_openai(fake_server.gated(gate, fake_server.ok())) as fake:
        # The first process has one slot: once its call is out, it claims nothing more.
        async with _fleet_replicas(pool, fake.base_url, (1, 4)) as (first, second):
            async with anyio.create_task_group() as tg:
                await tg.start(first.run)
                await fake.wait_until(lambda server: server.in_flight == 1)
                for n in range(3):
                    await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=n))
                await tg.start(second.run)
                await fake.wait_until(lambda server: server.in_flight == 2)
                refused = _refused(second)

                async def turned_away_or_sent() -> bool:
                    return _refused(second) >= refused + 2 or len(fake.requests) > 2

                await wait_until(turned_away_or_sent, timeout=10, what="a claim refused twice")
                assert (len(fake.requests), fake.in_flight) == (2, 2)
                gate.set()
                await wait_until(lambda: _all_succeeded(pool, 4), timeout=20, what="4 runs")
                tg.cancel_scope.cancel()
    assert fake.max_in_flight == 2
