"""W2 the rush: S schedules due in the same second; fan-out to run rows, first start, all done,
against a bare ``INSERT ... SELECT generate_series`` of S rows into the same table."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import Process, fresh_database, wait_drained, wait_for
from promptsched.store.embedded import EmbeddedPostgres


def _size() -> int:
    if os.environ.get("BENCH_SCALE") == "large":
        return 100_000
    return int(os.environ.get("BENCH_W2_SCHEDULES", "10000"))


async def _baseline(conn: asyncpg.Connection[Any], size: int) -> float:
    """One bare batched insert of ``size`` run rows (then removed)."""
    sid = await conn.fetchval("SELECT min(id) FROM schedules")
    start = time.perf_counter()
    await conn.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts) "
        "SELECT $1, now() - g * interval '1 second', 'backfill', 'echo', 3 "
        "FROM generate_series(1, $2) g",
        sid,
        size,
    )
    elapsed = time.perf_counter() - start
    await conn.execute("DELETE FROM runs WHERE origin = 'backfill'")
    return elapsed


async def _rush(
    embedded: EmbeddedPostgres, workdir: Path, size: int, analyze: bool
) -> dict[str, Any]:
    dsn = await fresh_database(embedded)
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at) "
        "SELECT 'w2-' || g, 'cron', '0 9 * * 1', 'p', '2020-01-06 09:00+00' "
        "FROM generate_series(1, $1) g",
        size,
    )
    if analyze:
        await conn.execute("ANALYZE")
    baseline = min([await _baseline(conn, size) for _ in range(3)])
    # Every schedule is due at T, a few seconds ahead; the service is idle until then.
    slot = await conn.fetchval("SELECT date_trunc('second', now()) + interval '5 seconds'")
    # A cron (seconds first) that fires at exactly that second, once a year: the cursor must
    # be one of the expression's fire times.
    expression = f"{slot.second} {slot.minute} {slot.hour} {slot.day} {slot.month} *"
    await conn.execute("UPDATE schedules SET next_fire_at = $1, expression = $2", slot, expression)
    label = "analyzed" if analyze else "stale"
    process = Process(
        dsn,
        workdir / f"w2-{label}.log",
        {"PROMPTSCHED_WORKERS": "64", "PROMPTSCHED_SCHEDULER_BATCH": "5000"},
    )
    try:
        # Both probes are index lookups: counting 100,000 rows every few milliseconds would
        # take a core from the rush it measures. A schedule's cursor moves in the transaction
        # that writes its runs, so no schedule due at the slot means every row exists.
        async def all_rows() -> bool:
            return not await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM schedules WHERE enabled AND next_fire_at <= $1)",
                slot,
            )

        await wait_for(all_rows, 300)

        await wait_drained(conn, 600, interval=0.2)
        row = await conn.fetchrow(
            "SELECT extract(epoch FROM max(r.created_at) - $1) AS fanout, "
            "extract(epoch FROM min(a.started_at) - $1) AS first_start, "
            "extract(epoch FROM max(r.finished_at) - $1) AS all_done "
            "FROM runs r LEFT JOIN run_attempts a ON a.run_id = r.id",
            slot,
        )
    finally:
        process.stop()
        await conn.close()
    fanout = float(row["fanout"])
    return {
        f"fanout_s_{label}": fanout,
        f"baseline_insert_s_{label}": baseline,
        f"fanout_vs_baseline_{label}": fanout / baseline,
        f"first_start_s_{label}": float(row["first_start"]),
        f"all_finished_s_{label}": float(row["all_done"]),
        f"runs_per_s_overall_{label}": size / float(row["all_done"]),
    }


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, Any]:
    size = _size()
    results: dict[str, Any] = {"schedules": size}
    for analyze in (True, False):
        results.update(await _rush(embedded, workdir, size, analyze))
    return results
