"""Rows for tests, inserted through plain SQL (the state a scenario starts from)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from promptsched.clock import Clock
from promptsched.config import WorkerSettings
from promptsched.executors.base import Registry
from promptsched.executors.echo import EchoExecutor
from promptsched.executors.limiter import Limiter
from promptsched.metrics import Metrics
from promptsched.prices import Prices
from promptsched.roles.worker import WorkerPool
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.store import pool as pools
from promptsched.store import queries

EPOCH = datetime.fromisoformat("2026-03-02T09:00:00+00:00")


async def schedule(
    pool: asyncpg.Pool[Any],
    *,
    kind: str = "cron",
    expression: str = "0 9 * * *",
    params: dict[str, Any] | None = None,
    max_attempts: int = 3,
    timeout: timedelta = timedelta(minutes=5),
    overlap: str = "skip",
    enabled: bool = True,
    next_fire_at: datetime | None = None,
    prompt: str = "hello",
    timezone: str = "UTC",
    misfire: str = "run_once",
    output_schema: dict[str, Any] | None = None,
    notify_when: str = "always",
    notify: dict[str, Any] | None = None,
    name: str | None = None,
    owner: str = "default",
) -> int:
    """A schedule row of ``owner``, named ``name``, else ``test`` (``test 2``, ``test 3``...
    when that is taken: the database keeps names unique per owner, migration 0036)."""
    if name is None:
        taken = await pool.fetchval(
            "SELECT count(*) FROM schedules WHERE owner = $1 AND name ~ '^test( \\d+)?$'", owner
        )
        name = "test" if not taken else f"test {taken + 1}"
    sid: int = await pool.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt, params, max_attempts, timeout, "
        "overlap_policy, enabled, next_fire_at, timezone, misfire_policy, output_schema, "
        "notify_when, notify, owner) VALUES ($15, $1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, "
        "$10, $11, $12, $13, $14, $16) RETURNING id",
        kind,
        expression,
        prompt,
        params or {},
        max_attempts,
        timeout,
        overlap,
        enabled,
        next_fire_at,
        timezone,
        misfire,
        output_schema,
        notify_when,
        notify or {},
        name,
        owner,
    )
    return sid


async def pending_run(
    pool: asyncpg.Pool[Any], schedule_id: int, slot: datetime = EPOCH, origin: str = "cadence"
) -> int:
    rid: int = await pool.fetchval(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT id, $2, $3, provider, max_attempts, $2 FROM schedules WHERE id = $1 RETURNING id",
        schedule_id,
        slot,
        origin,
    )
    return rid


def worker_pool(
    pool: asyncpg.Pool[Any],
    clock: Clock,
    metrics: Metrics | None = None,
    *,
    slots: int = 4,
    lease: timedelta = timedelta(seconds=30),
    worker_id: str = "test-worker",
    prices: Prices | None = None,
) -> WorkerPool:
    metrics = metrics or Metrics()
    prices = prices or Prices()
    metrics.know(prices.models(["echo"]))
    heartbeat = Heartbeat(pool, clock, metrics, lease=lease, interval=lease / 3)
    return WorkerPool(
        pool,
        clock,
        metrics,
        Registry({"echo": EchoExecutor()}),
        {"echo": Limiter(1000)},
        heartbeat,
        WorkerSettings(
            slots=slots,
            worker_id=worker_id,
            retry_base=timedelta(seconds=10),
            retry_max=timedelta(minutes=5),
            prices=prices,
        ),
    )


async def run_row(pool: asyncpg.Pool[Any], run_id: int) -> asyncpg.Record:
    """The run's row as it stands now."""
    row: asyncpg.Record | None = await pool.fetchrow("SELECT * FROM runs WHERE id = $1", run_id)
    assert row is not None
    return row


async def attempt_rows(pool: asyncpg.Pool[Any], run_id: int) -> list[asyncpg.Record]:
    """The run's attempts, first to last."""
    return await pool.fetch("SELECT * FROM run_attempts WHERE run_id = $1 ORDER BY number", run_id)


async def attempt_statuses(pool: asyncpg.Pool[Any], run_id: int) -> list[str]:
    """The statuses of the run's attempts, first to last."""
    return [row["status"] for row in await attempt_rows(pool, run_id)]


async def runs_settled(pool: asyncpg.Pool[Any]) -> bool:
    """No run is pending or running (a predicate for ``tests.helpers.wait_until``)."""
    return not await pool.fetchval(
        "SELECT count(*) FROM runs WHERE status IN ('pending', 'running')"
    )


async def ticking_schedule(pool: asyncpg.Pool[Any], *, announce: bool = True, **fields: Any) -> int:
    """A per-second schedule first due at the next whole second (the database's clock),
    announced to the running schedulers as the API does (so they wake up now) unless
    ``announce`` is false; its id."""
    start = await pool.fetchval("SELECT date_trunc('second', now()) + interval '1 second'")
    sid = await schedule(pool, expression="* * * * * *", next_fire_at=start, **fields)
    if announce:
        await queries.schedule_notify_changed(pool, sid)
    return sid


def work_once(dsn: str) -> None:
    """One pass of an in-process worker over the runs due now, from synchronous code (a CLI
    test whose service, if any, only answers HTTP)."""

    async def drain() -> None:
        pool = await pools.create_pool(dsn)
        try:
            await worker_pool(pool, Clock()).run_once()
        finally:
            await pool.close()

    asyncio.run(drain())
