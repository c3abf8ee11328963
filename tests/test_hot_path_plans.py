"""Every statement on the hot path costs what its own batch costs, however many runs are in
flight (docs/performance.md, "Plans that stay right"): the claim, the heartbeat, the finish,
the release, the reap and the reaper's wake-up, the dispatcher's wait and the scheduler's
tick. Each runs against a table with 20,000 finished runs, 2,000+ running and a backlog, under
statistics taken then (fresh) and under statistics taken while only the history existed
(stale: right after a rush, before any ANALYZE), with its generic plan and with a custom one.
What each reads of `runs` and its indexes is counted (pg_stat_xact_*, this transaction's own
counters, functions called by the statement included); three times the runs in flight must not
make any statement read more."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.domain import RunStatus
from promptsched.store import queries
from tests.factories import EPOCH

LEASE = timedelta(seconds=30)
HISTORY = 20_000
RUNNING = 2_500
BACKLOG = 5_000
BATCH = 10
# Reads that do not depend on the runs in flight still move a little with the table (an
# index one level deeper, a page more of dead entries): a statement may read this many more.
SLACK = 40

Statement = Callable[["asyncpg.Connection[Any]"], Awaitable[object]]


async def _runs(conn: asyncpg.Connection[Any], sid: int, count: int, status: str) -> None:
    """``count`` runs of schedule ``sid`` in ``status`` (running ones hold a lease and an
    attempt; finished ones are history)."""
    await conn.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, status, "
        "attempts, attempt_id, worker_id, lease_expires_at, deadline_at, attempt_started_at, "
        "available_at, finished_at) "
        "SELECT $1, $2::timestamptz - g * interval '1 second' - random() * interval '1 day', "
        "'manual', 'llm', 3, $3::text, "
        "CASE WHEN $3 = 'pending' THEN 0 ELSE 1 END, "
        "CASE WHEN $3 = 'pending' THEN NULL ELSE gen_random_uuid() END, "
        "CASE WHEN $3 = 'pending' THEN NULL ELSE 'w' END, "
        "CASE WHEN $3 = 'running' THEN $2::timestamptz + interval '30 seconds' END, "
        "CASE WHEN $3 = 'running' THEN $2::timestamptz + interval '5 minutes' END, "
        "CASE WHEN $3 = 'pending' THEN NULL ELSE $2::timestamptz END, "
        "$2::timestamptz - interval '1 hour', "
        "CASE WHEN $3 = 'succeeded' THEN $2::timestamptz END "
        "FROM generate_series(1, $4) g",
        sid,
        EPOCH,
        status,
        count,
    )


async def _schedule(conn: asyncpg.Connection[Any], name: str, *, due: bool) -> int:
    sid: int = await conn.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt, provider, overlap_policy, "
        "next_fire_at) VALUES ($1, 'cron', '* * * * *', 'p', 'llm', 'skip', $2) RETURNING id",
        name,
        EPOCH if due else None,
    )
    return sid


async def _load(conn: asyncpg.Connection[Any], *, stale: bool) -> int:
    """The table a drain meets: history, runs in flight, a backlog, and 50 due schedules
    (each with one run in flight, so the tick's overlap probe finds something). Returns the
    schedule the runs in flight belong to."""
    sid = await _schedule(conn, "busy", due=False)
    await _runs(conn, sid, HISTORY, "succeeded")
    if stale:
        await conn.execute("ANALYZE")  # what the statistics know: history only
    await _runs(conn, sid, RUNNING, "running")
    await _runs(conn, sid, BACKLOG, "pending")
    for n in range(50):
        await _runs(conn, await _schedule(conn, f"due{n}", due=True), 1, "running")
    if not stale:
        await conn.execute("ANALYZE")
    return sid


async def _in_flight(conn: asyncpg.Connection[Any]) -> tuple[list[int], list[Any]]:
    rows = await conn.fetch(
        "SELECT id, attempt_id FROM runs WHERE status = 'running' ORDER BY random() LIMIT $1",
        BATCH,
    )
    return [r["id"] for r in rows], [r["attempt_id"] for r in rows]


def _statements(ids: list[int], attempts: list[Any]) -> dict[str, Statement]:
    """The hot path, each statement through its own wrapper, with a batch of ``BATCH``."""
    finishes = [
        queries.Finish(run_id, attempt, RunStatus.SUCCEEDED, "succeeded", output="ok")
        for run_id, attempt in zip(ids, attempts, strict=True)
    ]
    # The same finishes for a `changed` monitor: each is decided against its schedule's memory
    # in the finish itself (monitor_decide).
    watched = [
        dataclasses.replace(f, watch={"fingerprint": f"fp{n}", "what": "output"})
        for n, f in enumerate(finishes)
    ]

    async def tick(conn: asyncpg.Connection[Any]) -> object:
        batch = await queries.schedule_take_due(conn, EPOCH, 50)
        assert batch.taken == 50, "the due schedules were not taken"
        variants = [
            queries.Variant(
                group.ids,
                EPOCH + timedelta(minutes=1),
                False,
                "llm",
                3,
                "skip",
                [queries.PlannedRun(EPOCH, RunStatus.SKIPPED, "overlap", 0, EPOCH)],
            )  # fmt: skip
            for group in batch
        ]
        return await queries.schedule_tick(conn, EPOCH, queries.TickWrite(variants), all_rows=False)

    return {
        "run_claim_batch": lambda c: queries.run_claim_batch(c, EPOCH, "llm", 64, "w2", LEASE),
        "run_claim_limited": lambda c: queries.run_claim_limited(
            c, EPOCH, "llm", 64, "w2", LEASE, max_concurrency=100_000, rate=None, burst=1.0
        ),
        # The claimer's returned calls counted out by key (0034_provider_admit_calls_in_flight).
        "run_claim_limited (returned)": lambda c: queries.run_claim_limited(
            c,
            EPOCH,
            "llm",
            64,
            "w2",
            LEASE,
            max_concurrency=100_000,
            rate=None,
            burst=1.0,
            returned=ids,
            returned_attempts=attempts,
        ),  # fmt: skip
        "run_heartbeat_many": lambda c: queries.run_heartbeat_many(c, EPOCH, ids, attempts, LEASE),
        "run_finish_many": lambda c: queries.run_finish_many(c, EPOCH, finishes, "w"),
        "run_finish_many (changed)": lambda c: queries.run_finish_many(c, EPOCH, watched, "w"),
        "run_release_many": lambda c: queries.run_release_many(c, EPOCH, ids, attempts, "w"),
        "run_reap_expired": lambda c: queries.run_reap_expired(c, EPOCH, 100, LEASE),
        "run_seconds_until_lease_expiry": lambda c: queries.run_seconds_until_lease_expiry(
            c, EPOCH
        ),
        "run_seconds_until_available": lambda c: queries.run_seconds_until_available(
            c, EPOCH, ["llm"]
        ),
        "schedule_take_due+schedule_tick": tick,
    }


_READ = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)::bigint
       + (SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_xact_user_tables
          WHERE relname = 'runs')
FROM pg_index i WHERE i.indrelid = 'runs'::regclass
"""


async def _reads(
    conn: asyncpg.Connection[Any], statement: Statement, plans: str
) -> tuple[int, object]:
    """Rows and index entries of `runs` the statement read, in a transaction rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(f"SET LOCAL plan_cache_mode = {plans}")
        before: int = await conn.fetchval(_READ)
        result = await statement(conn)
        after: int = await conn.fetchval(_READ)
    finally:
        await tx.rollback()
    return after - before, result


PLANS = ("force_custom_plan", "force_generic_plan")


async def _round(
    conn: asyncpg.Connection[Any], statements: dict[str, Statement]
) -> dict[tuple[str, str], tuple[int, object]]:
    """Every statement under either plan. Each is rolled back, and what it left behind (dead
    row versions, dead index entries) is vacuumed first, so that both rounds start alike;
    VACUUM leaves the column statistics as they were."""
    await conn.execute("VACUUM (INDEX_CLEANUP ON) runs")
    return {
        (name, mode): await _reads(conn, run, mode)
        for name, run in statements.items()
        for mode in PLANS
    }


@pytest.mark.parametrize("stale", [False, True], ids=["fresh-stats", "stale-stats"])
async def test_no_hot_path_statement_reads_more_with_more_runs_in_flight(
    pool: asyncpg.Pool[Any], stale: bool
) -> None:
    async with pool.acquire() as conn:
        busy = await _load(conn, stale=stale)
        ids, attempts = await _in_flight(conn)
        statements = _statements(ids, attempts)
        first = await _round(conn, statements)
        await _runs(conn, busy, 2 * RUNNING, "running")  # three times the runs in flight
        if not stale:
            await conn.execute("ANALYZE")
        then = await _round(conn, statements)
    # The statements did their work (a claim claimed, a finish landed, ...), ...
    for mode in PLANS:
        assert len(first["run_claim_batch", mode][1]) == 64  # type: ignore[arg-type]
        counted = first["run_claim_limited", mode][1].room.running  # type: ignore[attr-defined]
        returned = first["run_claim_limited (returned)", mode][1]
        assert returned.room.running == counted - BATCH  # type: ignore[attr-defined]
        assert len(first["run_finish_many", mode][1]) == BATCH  # type: ignore[arg-type]
        assert len(first["run_finish_many (changed)", mode][1]) == BATCH  # type: ignore[arg-type]
        assert len(first["run_heartbeat_many", mode][1]) == BATCH  # type: ignore[arg-type]
        assert first["run_release_many", mode][1] == BATCH
        assert first["run_reap_expired", mode][1] == []
    # ... and none read more for three times the runs in flight.
    grew = {
        key: (first[key][0], then[key][0]) for key in first if then[key][0] > first[key][0] + SLACK
    }
    assert grew == {}, f"reads (at {RUNNING}, at {3 * RUNNING} in flight): {grew}"
    # A batch of BATCH rows reads a few entries per row, not the runs in flight.
    heavy = {key: reads for key, (reads, _) in then.items() if reads > 400}
    assert heavy == {}, heavy
