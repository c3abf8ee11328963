"""W1 claim throughput: N no-op runs pending, drained by a service with 16 and 64 worker slots,
against a bare ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT k)`` loop from
16 connections on the same table. Measured with fresh and with stale statistics."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import Process, fresh_database, wait_drained
from promptsched.store.embedded import EmbeddedPostgres

_BARE = """
UPDATE runs SET status = 'succeeded', finished_at = now(), attempts = attempts + 1
WHERE id IN (SELECT id FROM runs WHERE status = 'pending' AND provider = 'echo'
             AND available_at <= now() ORDER BY available_at, id LIMIT $1
             FOR UPDATE SKIP LOCKED)
RETURNING id"""


async def _fill(conn: asyncpg.Connection[Any], size: int, analyze: bool) -> None:
    await conn.execute("TRUNCATE runs CASCADE")
    await conn.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT (SELECT min(id) FROM schedules), now() - g * interval '1 millisecond', "
        "'manual', 'echo', 3, now() - interval '1 hour' FROM generate_series(1, $1) g",
        size,
    )
    if analyze:
        await conn.execute("ANALYZE runs")


async def _baseline(dsn: str, conn: asyncpg.Connection[Any], size: int, analyze: bool) -> float:
    await _fill(conn, size, analyze)
    conns = [await asyncpg.connect(dsn) for _ in range(16)]

    async def loop(c: asyncpg.Connection[Any]) -> None:
        while await c.fetch(_BARE, 10):
            pass

    start = time.perf_counter()
    await asyncio.gather(*(loop(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        await c.close()
    return size / elapsed


# A fleet-wide limit far above what binds: the claim then takes the provider's advisory lock,
# counts its running runs and reads its rate bucket (docs/providers.md) on every claim.
FLEET_LIMITED = {"PROMPTSCHED_PROVIDERS": "echo",
                 "PROMPTSCHED_PROVIDER_ECHO_MAX_CONCURRENCY": "100000",
                 "PROMPTSCHED_PROVIDER_ECHO_RATE": "1000000"}  # fmt: skip


async def _service(
    dsn: str,
    conn: asyncpg.Connection[Any],
    size: int,
    workers: int,
    analyze: bool,
    log: Path,
    env: dict[str, str] | None = None,
) -> float:
    await _fill(conn, 0, analyze)
    process = Process(dsn, log, {"PROMPTSCHED_WORKERS": str(workers), **(env or {})})
    try:
        await asyncio.sleep(2)  # service start-up is not measured
        await _fill(conn, size, analyze)
        await conn.execute("SELECT pg_notify('promptsched_runs', 'bench')")
        await wait_drained(conn, 900, interval=0.1)
        span = await conn.fetchval(
            "SELECT extract(epoch FROM max(r.finished_at) - min(a.started_at)) "
            "FROM runs r JOIN run_attempts a ON a.run_id = r.id"
        )
    finally:
        process.stop()
    return size / float(span)


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, Any]:
    size = int(os.environ.get("BENCH_W1_RUNS", "5000"))
    dsn = await fresh_database(embedded)
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "INSERT INTO schedules (name, kind, expression, prompt) "
        "VALUES ('w1', 'cron', '0 9 * * 1', 'p')"
    )
    results: dict[str, Any] = {"runs": size}
    try:
        for analyze, label in ((True, "analyzed"), (False, "stale")):
            bare = await _baseline(dsn, conn, size, analyze)
            results[f"bare_runs_per_s_{label}"] = bare
            for workers in (16, 64):
                rate = await _service(
                    dsn, conn, size, workers, analyze, workdir / f"w1-{workers}-{label}.log"
                )
                results[f"service_{workers}_runs_per_s_{label}"] = rate
                results[f"service_{workers}_vs_bare_{label}"] = rate / bare
                if analyze:  # the same drain under a fleet-wide limit that never binds
                    limited = await _service(
                        dsn, conn, size, workers, analyze,
                        workdir / f"w1-{workers}-fleet-limited.log", FLEET_LIMITED,
                    )  # fmt: skip
                    results[f"service_{workers}_fleet_limited_runs_per_s"] = limited
                    results[f"service_{workers}_fleet_limited_vs_unlimited"] = limited / rate
    finally:
        await conn.close()
    return results
