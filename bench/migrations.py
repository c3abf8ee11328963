"""How long the pending migrations block the fleet on a large database (docs/deploying.md,
"Upgrading"): a database migrated to ``--from`` and filled with ``--runs`` historical runs
(and 1,000 schedules), then the rest applied by ``promptsched migrate``'s runner while a probe
writes to `runs` and `schedules` as the fleet does (a finish, a cursor advance) every 10 ms.
Reported: each migration's wall time, and the longest any probe write waited (what a
replica's claim, finish or tick would have waited).

    python -m bench.migrations --runs 1000000 --from 34
    python -m bench.migrations --runs 1000000 --from 19
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg

from bench import common
from promptsched.store import migrate
from promptsched.store import pool as pools

_FILL_RUNS = """
INSERT INTO runs (schedule_id, slot, provider, max_attempts, status, finished_at)
SELECT 1 + g % 1000, now() - g * interval '1 second', 'echo', 3,
       CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'succeeded' END,
       CASE WHEN g % 100 = 0 THEN NULL ELSE now() - g * interval '1 second' END
FROM generate_series($1::bigint, $2::bigint) g
"""


async def _fill(dsn: str, runs: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO schedules (name, kind, expression, prompt) "
            "SELECT 's' || g, 'cron', '0 0 1 1 *', 'p' FROM generate_series(1, 1000) g"
        )
        step = 500_000
        for start in range(1, runs + 1, step):
            await conn.execute(_FILL_RUNS, start, min(runs, start + step - 1))
        await conn.execute("VACUUM ANALYZE runs")
        await conn.execute("VACUUM ANALYZE schedules")
    finally:
        await conn.close()


async def _probe(dsn: str, stop: asyncio.Event, waits: list[tuple[float, float]]) -> None:
    """A write to each hot table every 10 ms: (when, how long it waited)."""
    conn = await asyncpg.connect(dsn)
    try:
        run_id = await conn.fetchval("SELECT max(id) FROM runs")
        while not stop.is_set():
            started = time.monotonic()
            await conn.execute("UPDATE runs SET max_attempts = 3 WHERE id = $1", run_id)
            await conn.execute("UPDATE schedules SET next_fire_at = NULL WHERE id = 1")
            waits.append((started, time.monotonic() - started))
            await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def main(runs: int, start: int) -> dict[str, Any]:
    with common.server() as embedded:
        admin = await asyncpg.connect(embedded.dsn())
        await admin.execute("CREATE DATABASE bench_migrations")
        await admin.close()
        dsn = embedded.dsn("bench_migrations")
        conn = await pools.connect(dsn)
        chain = migrate.all_migrations()
        await migrate.apply(conn, chain=chain[:start])
        filled = time.monotonic()
        await _fill(dsn, runs)
        print(f"{runs:,} runs written in {time.monotonic() - filled:.0f} s", flush=True)
        stop = asyncio.Event()
        waits: list[tuple[float, float]] = []
        probe = asyncio.create_task(_probe(dsn, stop, waits))
        await asyncio.sleep(0.5)
        spans: list[tuple[str, float, float]] = []
        for migration in chain[start:]:
            began = time.monotonic()
            await migrate.apply(conn, chain=chain[: migration.version])
            spans.append((migration.label, began, time.monotonic()))
        await asyncio.sleep(0.5)
        stop.set()
        await probe
        await conn.close()
    report: dict[str, Any] = {"runs": runs, "from": start, "migrations": []}
    for label, began, ended in spans:
        during = [w for at, w in waits if began - 0.05 <= at <= ended]
        blocked = max(during, default=0.0)
        report["migrations"].append(
            {"migration": label, "seconds": round(ended - began, 3), "blocked": round(blocked, 3)}
        )
        print(f"{label:45} {ended - began:8.3f} s   longest write waited {blocked:6.3f} s")
    total = sum(m["seconds"] for m in report["migrations"])
    longest = max((w for _, w in waits), default=0.0)
    report["total_seconds"] = round(total, 3)
    report["longest_wait"] = round(longest, 3)
    print(f"all: {total:.2f} s; the longest any write waited: {longest:.3f} s")
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--from", dest="start", type=int, default=migrate.LEGACY_LAST)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.start))
