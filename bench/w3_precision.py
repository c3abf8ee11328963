"""W3 tick precision: second-level crons on an idle service; slot→run-row and slot→start lag."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import Process, fresh_database, spread, wait_drained
from promptsched.store.embedded import EmbeddedPostgres


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, Any]:
    schedules = int(os.environ.get("BENCH_W3_SCHEDULES", "200"))
    seconds = float(os.environ.get("BENCH_W3_SECONDS", "60"))
    dsn = await fresh_database(embedded)
    # "Idle workers": enough slots that every run of a second can start at once.
    process = Process(dsn, workdir / "w3.log", {"PROMPTSCHED_WORKERS": str(schedules)})
    conn = await asyncpg.connect(dsn)
    try:
        await asyncio.sleep(2)  # let the service start: not part of any measured figure
        await conn.execute(
            "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at) "
            "SELECT 'w3-' || g, 'cron', '* * * * * *', 'p', date_trunc('second', now()) "
            "+ interval '2 seconds' FROM generate_series(1, $1) g",
            schedules,
        )
        await conn.execute("SELECT pg_notify('promptsched_schedules', 'bench')")
        await asyncio.sleep(seconds)
        await conn.execute("UPDATE schedules SET next_fire_at = NULL")
        await wait_drained(conn, 60)
        rows = await conn.fetch(
            "SELECT extract(epoch FROM r.created_at - r.slot) AS tick, "
            "extract(epoch FROM a.started_at - r.slot) AS start "
            "FROM runs r JOIN run_attempts a ON a.run_id = r.id AND a.number = 1 "
            "WHERE r.status = 'succeeded'"
        )
        skipped = await conn.fetchval("SELECT count(*) FROM runs WHERE status = 'skipped'")
    finally:
        await conn.close()
        process.stop()
    tick = [float(r["tick"]) * 1000 for r in rows]
    start = [float(r["start"]) * 1000 for r in rows]
    return {
        "schedules": schedules,
        "seconds": seconds,
        "runs": len(rows),
        "skipped": skipped,
        **spread("tick_lag_ms", tick),
        **spread("start_lag_ms", start),
    }
