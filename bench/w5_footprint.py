"""W5 footprint: resident memory of one process idle, and holding 1,000 in-flight runs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import Process, fresh_database, wait_for
from promptsched.store.embedded import EmbeddedPostgres


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, Any]:
    inflight = int(os.environ.get("BENCH_W5_RUNS", "1000"))
    dsn = await fresh_database(embedded)
    conn = await asyncpg.connect(dsn)
    process = Process(dsn, workdir / "w5.log", {"PROMPTSCHED_WORKERS": str(inflight)})
    try:
        await asyncio.sleep(3)  # settle after start-up
        idle = _rss_mb(process.process.pid)
        sid = await conn.fetchval(
            "INSERT INTO schedules (name, kind, expression, prompt, params) VALUES "
            "('w5', 'cron', '0 9 * * 1', 'p', '{\"latency\": \"60s\"}') RETURNING id"
        )
        await conn.execute(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts) "
            "SELECT $1, now() - g * interval '1 ms', 'manual', 'echo', 3 "
            "FROM generate_series(1, $2) g",
            sid,
            inflight,
        )
        await conn.execute("SELECT pg_notify('promptsched_runs', '')")

        async def all_running() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) >= $1 FROM runs WHERE status = 'running'", inflight
                )
            )

        await wait_for(all_running, 60)
        await asyncio.sleep(2)  # a couple of heartbeats with everything in flight
        busy = _rss_mb(process.process.pid)
    finally:
        process.stop()
        await conn.close()
    return {"idle_rss_mb": idle, "inflight_runs": inflight, "inflight_rss_mb": busy}
