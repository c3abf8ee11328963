"""The rush writes first: while this process's scheduler writes a rush (a batch came back full,
so more is due now), its worker pool fills one slot; when the rush is written,
every slot again, woken at once. Real Postgres, the real scheduler and pool."""

from __future__ import annotations

from typing import Any

import asyncpg

from promptsched.clock import FrozenClock
from promptsched.config import SchedulerSettings
from promptsched.metrics import Metrics
from promptsched.roles.loop import Rush
from promptsched.roles.scheduler import Scheduler
from tests import factories
from tests.factories import EPOCH


async def _due(pool: asyncpg.Pool[Any], count: int) -> None:
    for _ in range(count):
        await factories.schedule(pool, expression="0 9 * * *", next_fire_at=EPOCH)


async def test_a_full_batch_is_a_rush_until_every_due_slot_is_written(
    pool: asyncpg.Pool[Any],
) -> None:
    rush = Rush()
    ended: list[bool] = []
    rush.on_end(lambda: ended.append(rush.active))
    seen: list[bool] = []
    settings = SchedulerSettings(batch=10, rush_batch=10)
    scheduler = Scheduler(pool, FrozenClock(EPOCH), Metrics(), settings, rush=rush)
    write = scheduler._tick_batch

    async def watched(size: int, more: Any) -> Any:
        counts = await write(size, more)
        seen.append(rush.active)
        return counts

    scheduler._tick_batch = watched  # type: ignore[method-assign]
    await _due(pool, 25)
    counts = await scheduler.run_once()
    assert counts.enqueued == 25
    assert True in seen and rush.rushes == 1  # the first full batch began it
    assert not rush.active and ended == [False]  # written: over, and the listener told
    # A quiet tick (fewer due than a batch) is no rush.
    await _due(pool, 5)
    await pool.execute("UPDATE schedules SET next_fire_at = $1 WHERE next_fire_at IS NOT NULL "
                       "AND id > 25", EPOCH)  # fmt: skip
    assert (await scheduler.run_once()).enqueued == 5
    assert rush.rushes == 1 and ended == [False]


async def test_during_a_rush_the_pool_fills_one_slot(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await factories.schedule(pool, params={"latency": "30s"})  # runs stay in flight
    now = await pool.fetchval("SELECT now()")
    for _ in range(20):
        await factories.pending_run(pool, sid, now, "manual")
    worker = factories.worker_pool(pool, FrozenClock(now), slots=8)
    worker.rush.begin()
    try:
        assert await worker.claim() == 1  # one slot while the rush is written
        assert await worker.claim() == 0  # still 1 in flight: no room during the rush
        worker.rush.end()
        assert await worker.claim() == 7  # the rest of the 8
    finally:
        await worker._stop_attempts()
    running = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'running'")
    assert running == 8
