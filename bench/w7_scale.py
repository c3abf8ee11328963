"""W7 scale check: with 1,000,000 schedules and 10,000,000 historical runs, the due-schedule
and claim queries stay index scans, and their latency stays flat."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import fresh_database
from promptsched.store import sqlfiles
from promptsched.store.embedded import EmbeddedPostgres


async def _plan(conn: asyncpg.Connection[Any], name: str, *args: Any) -> tuple[str, float]:
    sql = sqlfiles.queries()[name]
    rows = await conn.fetch(f"EXPLAIN (ANALYZE, FORMAT TEXT) {sql}", *args)
    text = "\n".join(r[0] for r in rows)
    ms = float(text.rsplit("Execution Time:", 1)[1].split("ms")[0])
    return text, ms


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, Any]:
    # The full check (1M schedules, 10M runs) takes about ten minutes to build on 2 cores:
    # BENCH_SCALE=large runs it; the default keeps `make bench` short at a tenth of that.
    large = os.environ.get("BENCH_SCALE") == "large"
    schedules = int(os.environ.get("BENCH_W7_SCHEDULES", "1000000" if large else "100000"))
    runs = int(os.environ.get("BENCH_W7_RUNS", "10000000" if large else "1000000"))
    dsn = await fresh_database(embedded)
    conn = await asyncpg.connect(dsn)
    try:
        start = time.perf_counter()
        await conn.execute(
            "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at) "
            "SELECT 's' || g, 'cron', '0 9 * * 1', 'p', now() + g * interval '1 second' "
            "FROM generate_series(1, $1) g",
            schedules,
        )
        # History: finished runs, plus a small live backlog due now.
        await conn.execute(
            "INSERT INTO runs (schedule_id, slot, provider, max_attempts, status, finished_at, "
            "attempts) SELECT 1 + g % $2, now() - g * interval '1 second', 'echo', 3, "
            "'succeeded', now() - g * interval '1 second', 1 FROM generate_series(1, $1) g",
            runs,
            schedules,
        )
        await conn.execute(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts) "
            "SELECT 1 + g, now() - interval '1 minute', 'manual', 'echo', 3 "
            "FROM generate_series(1, 1000) g"
        )
        await conn.execute(
            "UPDATE schedules SET next_fire_at = now() - interval '1 second' WHERE id <= 500"
        )
        await conn.execute("ANALYZE")
        built = time.perf_counter() - start
        await conn.execute("BEGIN")
        due_plan, due_ms = await _plan(conn, "schedule_take_due", None, 500, 0)
        claim_plan, claim_ms = await _plan(
            conn, "run_claim_batch", None, "echo", 64, "bench", timedelta(seconds=30)
        )
        await conn.execute("ROLLBACK")
    finally:
        await conn.close()
    due_ok = "schedules_due_idx" in due_plan and "Seq Scan" not in due_plan
    claim_ok = "runs_claim_idx" in claim_plan and "Seq Scan on runs" not in claim_plan
    if not (due_ok and claim_ok):
        (workdir / "w7-plans.txt").write_text(due_plan + "\n\n" + claim_plan)
    return {
        "schedules": schedules,
        "historical_runs": runs,
        "build_s": built,
        "due_query_index_scan": due_ok,
        "due_query_ms": due_ms,
        "claim_query_index_scan": claim_ok,
        "claim_query_ms": claim_ms,
    }
