"""W4 recovery: SIGKILL of the process holding a run, time until another process starts it,
for the default and the shortest supported lease; and the SIGTERM hand-off time."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import Process, fresh_database, wait_for
from promptsched.store.embedded import EmbeddedPostgres


async def _holder(conn: asyncpg.Connection[Any], run_id: int) -> str | None:
    worker: str | None = await conn.fetchval(
        "SELECT worker_id FROM runs WHERE id = $1 AND status = 'running'", run_id
    )
    return worker


async def _one(
    embedded: EmbeddedPostgres, workdir: Path, env: dict[str, str], how: int, label: str
) -> float:
    """Seconds from the signal (database clock) to the second attempt's start."""
    dsn = await fresh_database(embedded)
    conn = await asyncpg.connect(dsn)
    try:
        sid = await conn.fetchval(
            "INSERT INTO schedules (name, kind, expression, prompt, params, timeout) VALUES "
            "('w4', 'cron', '0 9 * * 1', 'p', '{\"latency\": \"120s\"}', '10 minutes') "
            "RETURNING id"
        )
        first = Process(dsn, workdir / f"w4-{label}-a.log", env)
        await asyncio.sleep(2)  # start-up, not measured
        run_id = await conn.fetchval(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts) "
            "VALUES ($1, now(), 'manual', 'echo', 5) RETURNING id",
            sid,
        )
        await conn.execute("SELECT pg_notify('promptsched_runs', '')")
        await wait_for(lambda: _holder(conn, run_id), 30)
        second = Process(dsn, workdir / f"w4-{label}-b.log", env)
        await asyncio.sleep(2)  # the rescuer is up before the fault
        signalled = await conn.fetchval("SELECT clock_timestamp()")
        first.process.send_signal(how)

        async def second_attempt() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) >= 2 FROM run_attempts WHERE run_id = $1", run_id
                )
            )

        await wait_for(second_attempt, 120, interval=0.01)
        started = await conn.fetchval(
            "SELECT started_at FROM run_attempts WHERE run_id = $1 AND number = 2", run_id
        )
        first.stop(signal.SIGKILL)
        second.stop(signal.SIGKILL)
        return float((started - signalled).total_seconds())
    finally:
        await conn.close()


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, Any]:
    shortest = {"PROMPTSCHED_LEASE": "1s", "PROMPTSCHED_HEARTBEAT": "500ms"}
    default: dict[str, str] = {}
    return {
        "sigkill_recovery_s_default_lease_30s": await _one(
            embedded, workdir, default, signal.SIGKILL, "kill-default"
        ),
        "sigkill_recovery_s_lease_1s": await _one(
            embedded, workdir, shortest, signal.SIGKILL, "kill-short"
        ),
        "sigterm_handoff_s_drain_grace_10s": await _one(
            embedded, workdir, default, signal.SIGTERM, "term-default"
        ),
        "sigterm_handoff_s_drain_grace_1s": await _one(
            embedded, workdir, {"PROMPTSCHED_DRAIN_GRACE": "1s"}, signal.SIGTERM, "term-short"
        ),
    }
