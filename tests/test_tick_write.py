"""The scheduler's batch write: named variants and planned runs become the statement's arrays
in one place (queries.TickWrite.arrays), and the statement writes what they name."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg

from promptsched.domain import RunStatus
from promptsched.store import queries
from tests import factories

T0 = datetime.fromisoformat("2026-03-02T09:00:00+00:00")
MIN = timedelta(minutes=1)


def _run(slot: datetime, status: RunStatus = RunStatus.PENDING, **kw: Any) -> queries.PlannedRun:
    return queries.PlannedRun(
        slot=slot,
        status=status,
        skip_reason=kw.get("skip_reason"),
        missed=kw.get("missed", 0),
        available_at=kw.get("available_at", slot),
    )


def _variant(ids: list[int], runs: list[queries.PlannedRun], **kw: Any) -> queries.Variant:
    return queries.Variant(
        schedule_ids=ids,
        next_fire_at=kw.get("next_fire_at", T0 + MIN),
        cancel=kw.get("cancel", False),
        provider=kw.get("provider", "echo"),
        max_attempts=kw.get("max_attempts", 3),
        overlap_policy=kw.get("overlap_policy", "skip"),
        runs=runs,
    )


def test_arrays_number_variants_from_one_and_repeat_them_per_schedule_and_row() -> None:
    write = queries.TickWrite(
        [
            _variant(
                [10, 11, 12], [_run(T0), _run(T0 - MIN, RunStatus.SKIPPED, skip_reason="misfire")]
            ),
            _variant([20], [], next_fire_at=None, cancel=True, provider="openai", max_attempts=1),
            _variant([30], [_run(T0, available_at=T0 + 7 * MIN, missed=4)], overlap_policy="allow"),
        ]
    )
    (ids, of, cursor, cancel, provider, attempts, policy, row_of, slot, status, reason, missed,
     available) = write.arrays()  # fmt: skip
    assert write.schedule_ids == ids == [10, 11, 12, 20, 30]
    assert of == [1, 1, 1, 2, 3]
    assert cursor == [T0 + MIN, None, T0 + MIN]
    assert cancel == [False, True, False]
    assert provider == ["echo", "openai", "echo"]
    assert attempts == [3, 1, 3]
    assert policy == ["skip", "skip", "allow"]
    assert row_of == [1, 1, 3]
    assert slot == [T0, T0 - MIN, T0]
    assert status == ["pending", "skipped", "pending"]
    assert reason == [None, "misfire", None]
    assert missed == [0, 0, 4]
    assert available == [T0, T0 - MIN, T0 + 7 * MIN]


def test_an_empty_write_is_thirteen_empty_arrays() -> None:
    assert queries.TickWrite([]).arrays() == tuple([] for _ in range(13))


async def test_the_statement_writes_each_schedule_its_variants_rows(
    pool: asyncpg.Pool[Any],
) -> None:
    a = await factories.schedule(pool)
    b = await factories.schedule(pool)
    write = queries.TickWrite(
        [
            _variant([a], [_run(T0), _run(T0 + MIN, RunStatus.SKIPPED, skip_reason="overlap")]),
            _variant([b], [_run(T0, available_at=T0 + 5 * MIN, missed=2)], next_fire_at=None,
                     provider="slow", max_attempts=7),
        ]
    )  # fmt: skip
    async with pool.acquire() as conn, conn.transaction():
        result = await queries.schedule_tick(conn, T0, write, all_rows=True)
    assert (result["enqueued"], result["skipped"], result["overlap"]) == (2, 1, 1)
    rows = await pool.fetch(
        "SELECT schedule_id, slot, status, skip_reason, missed_slots, provider, max_attempts,"
        " available_at FROM runs ORDER BY schedule_id, slot"
    )
    assert [tuple(r) for r in rows] == [
        (a, T0, "pending", None, 0, "echo", 3, T0),
        (a, T0 + MIN, "skipped", "overlap", 0, "echo", 3, T0 + MIN),
        (b, T0, "pending", None, 2, "slow", 7, T0 + 5 * MIN),
    ]
    cursors = await pool.fetch("SELECT id, next_fire_at FROM schedules ORDER BY id")
    assert [tuple(r) for r in cursors] == [(a, T0 + MIN), (b, None)]
