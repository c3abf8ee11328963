"""W2 the rush: S schedules due in the same second; fan-out to run rows, first start, all done,
against a bare ``INSERT ... SELECT generate_series`` of S rows into the same table; then the
same rush of S keyed follow-ups due in one slot, and its ratios to the plain one."""

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


async def _settle(conn: asyncpg.Connection[Any], analyze: bool) -> None:
    """Vacuum what the setup left dead and checkpoint, so that neither the baseline nor the
    rush shares the cores with an autovacuum or a checkpoint of the bench's own making (the
    baseline's deletes and the slot's update leave 100,000s of dead rows); both then pay what
    a write pays after a checkpoint, a page image on first touch. ``analyze`` False keeps the
    statistics stale."""
    await conn.execute("VACUUM ANALYZE" if analyze else "VACUUM")
    await conn.execute("CHECKPOINT")


async def _baseline(conn: asyncpg.Connection[Any], size: int, analyze: bool) -> float:
    """One bare batched insert of ``size`` run rows (then removed)."""
    sid = await conn.fetchval("SELECT min(id) FROM schedules")
    await _settle(conn, analyze)
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


async def _followups(conn: asyncpg.Connection[Any], size: int, slot: Any) -> None:
    """``size`` keyed follow-ups due at ``slot``, as POST /v1/followups stores them (a
    schedule of kind ``at`` with its key and vars, and its followups row)."""
    await conn.execute(
        "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at, followup_key, "
        "vars, misfire_grace) "
        "SELECT 'order-' || g, 'at', $2, 'Has order {{ order }} shipped?', $3::timestamptz, "
        "'order-' || g, jsonb_build_object('order', g), interval '366 days' "
        "FROM generate_series(1, $1) g",
        size, slot.isoformat(), slot,
    )  # fmt: skip
    await conn.execute(
        "INSERT INTO followups (schedule_id, owner, key, request, due_at, max_checks, horizon) "
        "SELECT id, owner, followup_key, jsonb_build_object('key', followup_key), $1, 10, "
        "$1::timestamptz + interval '30 days' FROM schedules",
        slot,
    )


async def _rush(
    embedded: EmbeddedPostgres, workdir: Path, size: int, analyze: bool, *, keyed: bool = False
) -> dict[str, Any]:
    dsn = await fresh_database(embedded)
    conn = await asyncpg.connect(dsn)
    if keyed:
        await _followups(conn, size, await conn.fetchval("SELECT now() + interval '1 hour'"))
    else:
        await conn.execute(
            "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at) "
            "SELECT 'w2-' || g, 'cron', '0 9 * * 1', 'p', '2020-01-06 09:00+00' "
            "FROM generate_series(1, $1) g",
            size,
        )
    if analyze:
        await conn.execute("ANALYZE")
    baseline = min([await _baseline(conn, size, analyze) for _ in range(3)])
    # Every schedule is due at T, a few seconds ahead; the service is idle until then (the
    # last baseline and the slot's update are vacuumed and checkpointed away first, _settle).
    slot = await conn.fetchval("SELECT date_trunc('second', now()) + interval '8 seconds'")
    # A cron (seconds first) that fires at exactly that second, once a year (the cursor must
    # be one of the expression's fire times); a follow-up's one instant.
    expression = (
        slot.isoformat()
        if keyed
        else f"{slot.second} {slot.minute} {slot.hour} {slot.day} {slot.month} *"
    )
    await conn.execute("UPDATE schedules SET next_fire_at = $1, expression = $2", slot, expression)
    await conn.execute("UPDATE followups SET due_at = $1", slot)
    await _settle(conn, analyze)
    if await conn.fetchval("SELECT now() > $1::timestamptz - interval '2 seconds'", slot):
        raise RuntimeError("w2: the setup ran past the slot; the fan-out would be misread")
    label = ("keyed_" if keyed else "") + ("analyzed" if analyze else "stale")
    # The scheduler's own defaults (a first batch of 2,000, then 5,000 while the rush lasts,
    # two in flight): the rush users run.
    process = Process(dsn, workdir / f"w2-{label}.log", {"PROMPTSCHED_WORKERS": "64"})
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
    # The same rush of keyed follow-ups (docs/followups.md): the scheduler's path, and each
    # finish recording its check.
    results.update(await _rush(embedded, workdir, size, True, keyed=True))
    results["keyed_fanout_vs_plain"] = (
        results["fanout_s_keyed_analyzed"] / results["fanout_s_analyzed"]
    )
    results["keyed_all_finished_vs_plain"] = (
        results["all_finished_s_keyed_analyzed"] / results["all_finished_s_analyzed"]
    )
    return results
