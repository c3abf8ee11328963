"""Plans that outgrow their tables (docs/performance.md): a scheduler's take is planned afresh
for every batch, never run from a generic plan cached while `runs` was small. Such a plan
probed unfinished runs with a sequential scan that compares every row with the batch's id
array, so a take cost seconds once a rush had written 100,000 runs."""

from __future__ import annotations

from datetime import datetime

from promptsched.clock import FrozenClock
from promptsched.config import SchedulerSettings
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from promptsched.store import pool as pools

T0 = datetime.fromisoformat("2026-03-02T09:00:00+00:00")


async def test_every_take_is_planned_for_its_batch(dsn: str) -> None:
    # One pooled connection, so every batch runs (and caches its statements) on it.
    pool = await pools.create_pool(dsn, min_size=1, max_size=1)
    try:
        await pool.execute(
            "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at) "
            "SELECT 's' || g, 'cron', '* * * * *', 'p', $1 FROM generate_series(1, 60) g",
            T0,
        )
        await pool.execute("VACUUM ANALYZE runs")  # `runs` is empty: a small table's plan
        scheduler = Scheduler(pool, FrozenClock(T0), Metrics(), SchedulerSettings(batch=5))
        # Twelve batches of five, one slot each: past the five custom plans after which
        # Postgres may settle on a generic one.
        assert (await scheduler.run_once()).enqueued == 60
        plans = await pool.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%Lock up to $2 due schedules%' "
            "AND statement NOT LIKE '%pg_prepared_statements%'"  # not this query itself
        )
    finally:
        await pool.close()
    assert plans is not None
    # Without the fresh planning this reads (8, 5): a generic plan from the sixth batch on.
    assert (plans["generic_plans"], plans["custom_plans"]) == (0, 13), dict(plans)
