"""Plans that outgrow their tables (docs/performance.md): a scheduler's take is planned afresh
for every batch, never run from a generic plan cached while `runs` was small. Such a plan
probed unfinished runs with a sequential scan that compares every row with the batch's id
array, so a take cost seconds once a rush had written 100,000 runs. And a rush that outgrows
the statistics of `runs` analyzes it, so that every session's cached claim and finish plans
are made again for the table the rush filled (migration 0018)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.config import SchedulerSettings
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import ANALYZE_AFTER, Scheduler
from promptsched.store import pool as pools
from promptsched.store import queries, sqlfiles

T0 = datetime.fromisoformat("2026-03-02T09:00:00+00:00")


async def _due(pool: asyncpg.Pool[Any], schedules: int) -> None:
    """``schedules`` cron schedules, every one due at T0."""
    await pool.execute(
        "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at) "
        "SELECT 's' || g, 'cron', '* * * * *', 'p', $1 FROM generate_series(1, $2) g",
        T0,
        schedules,
    )


async def _backlog(pool: asyncpg.Pool[Any], runs: int) -> None:
    await pool.execute(
        "INSERT INTO schedules (name, kind, expression, prompt) "
        "VALUES ('w', 'cron', '0 9 * * 1', 'p')"
    )
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT (SELECT min(id) FROM schedules), $1::timestamptz - g * interval '1 second', "
        "'manual', 'echo', 3, $1 FROM generate_series(1, $2) g",
        T0,
        runs,
    )
    await pool.execute("ANALYZE runs")


async def test_every_take_is_planned_for_its_batch(dsn: str) -> None:
    # One pooled connection, so every batch runs (and caches its statements) on it.
    pool = await pools.create_pool(dsn, min_size=1, max_size=1)
    try:
        await _due(pool, 60)
        await pool.execute("VACUUM ANALYZE runs")  # `runs` is empty: a small table's plan
        settings = SchedulerSettings(batch=5, rush_batch=5)
        scheduler = Scheduler(pool, FrozenClock(T0), Metrics(), settings)
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


async def _claim_plan(workers: asyncpg.Pool[Any]) -> str:
    """The plan the worker's connection would run its next 16-run claim with: the cached
    generic one, when Postgres settled on it."""
    async with workers.acquire() as conn:
        name = await conn.fetchval(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE '-- Lock up to%' "
            "AND statement NOT LIKE '%pg_prepared_statements%'"
        )
        assert name is not None, "the claim was never prepared on this connection"
        rows = await conn.fetch(
            f"EXPLAIN EXECUTE {name}('{T0.isoformat()}', 'echo', 16, 'w', '30 seconds')"
        )
    return "\n".join(row[0] for row in rows)


async def test_a_rush_that_outgrows_the_statistics_of_runs_has_every_session_plan_again(
    dsn: str,
) -> None:
    # The worker's one connection, and the scheduler's own pool: another session, as in a
    # service (or another replica) whose claims were cached before the rush.
    workers = await pools.create_pool(dsn, min_size=1, max_size=1)
    scheduling = await pools.create_pool(dsn, min_size=1, max_size=3)
    try:
        await _backlog(workers, 20)  # a nearly empty `runs`, analyzed
        for _ in range(15):  # past the five custom plans: a generic one, made for 20 rows
            claim = await queries.run_claim_batch(workers, T0, "echo", 1, "w", timedelta(30))
            finish = [queries.Finish(r.id, r.attempt_id, "succeeded", "succeeded") for r in claim]
            assert await queries.run_finish_many(workers, T0, finish, "w")
        assert "Seq Scan on runs" in await _claim_plan(workers)  # what the rush must not keep

        await _due(scheduling, ANALYZE_AFTER + 1_000)
        scheduler = Scheduler(scheduling, FrozenClock(T0), Metrics())
        assert (await scheduler.run_once()).enqueued == ANALYZE_AFTER + 1_000

        plan = await _claim_plan(workers)
        assert "Seq Scan on runs" not in plan, plan
        assert "runs_claim_idx" in plan, plan
    finally:
        await workers.close()
        await scheduling.close()


async def test_a_rush_the_statistics_already_cover_analyzes_nothing(dsn: str) -> None:
    pool = await pools.create_pool(dsn, min_size=1, max_size=3)
    try:
        await _due(pool, ANALYZE_AFTER)
        # `runs` held 20,000 rows when last analyzed (a table with history)
        await pool.execute(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, status) "
            "SELECT (SELECT min(id) FROM schedules), $1::timestamptz - g * interval '1 minute', "
            "'manual', 'echo', 3, 'succeeded' FROM generate_series(1, 20000) g",
            T0,
        )
        await pool.execute("ANALYZE runs")
        before = await pool.fetchval(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'runs'"
        )
        assert (await Scheduler(pool, FrozenClock(T0), Metrics()).run_once()).enqueued == (
            ANALYZE_AFTER
        )
        assert await queries.run_analyze_outgrown(pool, ANALYZE_AFTER) is None  # knew enough
        after = await pool.fetchval(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'runs'"
        )
        # More than they knew: analyzed, and the count they knew is the answer.
        assert await queries.run_analyze_outgrown(pool, 30_000) == 20_000
    finally:
        await pool.close()
    assert after == before


async def test_a_claim_keeps_a_generic_plan_for_its_size_class(dsn: str) -> None:
    """A LIMIT that is a parameter made Postgres plan every claim afresh (0.35-0.5 ms of a
    16-run claim's 1.5 ms); written in as a size class, the claim keeps a generic plan."""
    pool = await pools.create_pool(dsn, min_size=1, max_size=1)
    try:
        # A backlog large enough that a generic plan under a parameter LIMIT looked dear (at
        # 2,000 runs Postgres settled on one either way).
        await _backlog(pool, 40_000)
        for _ in range(20):
            claim = await queries.run_claim_batch(pool, T0, "echo", 16, "w", timedelta(30))
            assert len(claim) == 16
        plans = await pool.fetch(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '-- Lock up to%' "
            "AND statement NOT LIKE '%pg_prepared_statements%'"
        )
    finally:
        await pool.close()
    # One statement for the class of 16. With `LIMIT $3` this read (0, 20): planned each time.
    assert [tuple(p) for p in plans] == [(15, 5)]


@pytest.mark.parametrize("want", [1, 3, 5, 16, 33])
async def test_a_claim_takes_and_locks_what_it_asked_for_not_its_size_class(
    dsn: str, want: int
) -> None:
    pool = await pools.create_pool(dsn, min_size=2, max_size=2)
    try:
        await _backlog(pool, 100)
        async with pool.acquire() as claimer, claimer.transaction():
            claim = await queries.run_claim_batch(claimer, T0, "echo", want, "w", timedelta(30))
            # Another session, while the claim's locks are held: every pending run but the
            # claimed ones can still be locked.
            free = await pool.fetchval(
                "SELECT count(*) FROM (SELECT id FROM runs WHERE status = 'pending' "
                "FOR UPDATE SKIP LOCKED) AS unlocked"
            )
        running = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'running'")
    finally:
        await pool.close()
    assert len(claim) == want
    assert free == 100 - want  # the other session still sees the claimed ones as pending
    assert running == want


async def test_a_batch_runs_without_jit(pool: asyncpg.Pool[Any]) -> None:
    """The take's disabled sort costs 10^10 to the planner, past every JIT threshold: on a
    Postgres built with LLVM each take was compiled (0.5-1.8 s of CPU). The batch turns JIT off
    for its own transaction only."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            await queries.schedule_plan_fresh(conn)
            plan = "\n".join(
                row[0]
                for row in await conn.fetch(
                    "EXPLAIN " + sqlfiles.queries()["schedule_take_due"], T0, 10, 0
                )
            )
            assert await conn.fetchval("SELECT current_setting('jit')") == "off"
            await queries.schedule_plan_cached(conn)
            assert await conn.fetchval("SELECT current_setting('jit')") == "off"
        assert "10000000" in plan  # the disabled sort's cost that would have tipped JIT
        assert await conn.fetchval("SELECT current_setting('jit')") == "on"  # the session's own
