"""The scheduler against real Postgres with a frozen clock: cadence, policies, controls."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched import service
from promptsched.clock import FrozenClock
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from tests import factories

T0 = datetime.fromisoformat("2026-03-02T09:00:00+00:00")


def _scheduler(
    pool: asyncpg.Pool[Any], clock: FrozenClock, metrics: Metrics | None = None, batch: int = 500
) -> Scheduler:
    return Scheduler(pool, clock, metrics or Metrics(), batch=batch)


async def _create(pool: asyncpg.Pool[Any], clock: FrozenClock, **raw: Any) -> int:
    values = service.validate({"name": "s", "prompt": "p", **raw}, providers=["echo"])
    row = await service.create_schedule(pool, clock, values, owner="alice")
    return int(row["id"])


async def _runs(pool: asyncpg.Pool[Any], sid: int) -> list[tuple[str, str, str | None, int]]:
    rows = await pool.fetch(
        "SELECT slot, status, skip_reason, missed_slots FROM runs WHERE schedule_id = $1 "
        "ORDER BY slot, id",
        sid,
    )
    return [
        (r["slot"].strftime("%H:%M:%S"), r["status"], r["skip_reason"], r["missed_slots"])
        for r in rows
    ]


async def test_a_due_slot_becomes_one_run_and_the_cursor_moves(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=30))
    sid = await _create(pool, clock, cron="* * * * *")
    scheduler = _scheduler(pool, clock)
    assert (await scheduler.run_once()).enqueued == 0  # 09:00 not due yet
    clock.set(T0)
    counts = await scheduler.run_once()
    assert (counts.enqueued, counts.schedules) == (1, 1)
    assert await _runs(pool, sid) == [("09:00:00", "pending", None, 0)]
    assert await pool.fetchval("SELECT next_fire_at FROM schedules WHERE id = $1", sid) == (
        T0 + timedelta(minutes=1)
    )
    assert (await scheduler.run_once()).enqueued == 0


async def test_concurrent_schedulers_never_double_enqueue(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    ids = [await _create(pool, clock, cron="* * * * * *", overlap="allow") for _ in range(50)]
    clock.set(T0 + timedelta(seconds=5))
    schedulers = [_scheduler(pool, clock, batch=7) for _ in range(4)]
    async with anyio.create_task_group() as tg:
        for scheduler in schedulers:
            tg.start_soon(scheduler.run_once)
    rows = await pool.fetch("SELECT schedule_id, slot FROM runs")
    assert len(rows) == len({(r["schedule_id"], r["slot"]) for r in rows}) == 50 * 6
    assert {r["schedule_id"] for r in rows} == set(ids)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # An on-time slot (09:10) runs anyway, so run_once coalesces the late ones into a
        # skipped row rather than running twice at once.
        pytest.param(
            "run_once",
            [("09:09:00", "skipped", "misfire", 8), ("09:10:00", "pending", None, 0)],
            id="run_once-with-an-on-time-slot",
        ),
        pytest.param(
            "skip",
            [("09:09:00", "skipped", "misfire", 8), ("09:10:00", "pending", None, 0)],
            id="skip-records-one-skipped-row",
        ),
        pytest.param(
            "run_all",
            [(f"09:0{m}:00", "pending", None, 0) for m in range(1, 10)]
            + [("09:10:00", "pending", None, 0)],
            id="run_all-runs-each",
        ),
    ],
)
async def test_misfire_after_downtime(
    pool: asyncpg.Pool[Any], policy: str, expected: list[Any]
) -> None:
    clock = FrozenClock(T0 + timedelta(seconds=30))
    sid = await _create(
        pool, clock, cron="* * * * *", misfire=policy, misfire_grace="30s", overlap="allow"
    )
    clock.set(T0 + timedelta(minutes=10, seconds=5))  # "down" from 09:00:30 to 09:10:05
    metrics = Metrics()
    await _scheduler(pool, clock, metrics).run_once()
    assert await _runs(pool, sid) == expected
    dropped = metrics.dropped_ticks.labels("misfire")._value.get()
    assert dropped == {"run_once": 9, "skip": 9, "run_all": 0}[policy]


async def test_run_once_without_an_on_time_slot_runs_the_latest_late_one(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(T0 + timedelta(seconds=30))
    sid = await _create(pool, clock, cron="* * * * *", misfire_grace="0s")
    clock.set(T0 + timedelta(minutes=9, seconds=30))
    metrics = Metrics()
    await _scheduler(pool, clock, metrics).run_once()
    assert await _runs(pool, sid) == [("09:09:00", "pending", None, 8)]
    assert metrics.dropped_ticks.labels("misfire")._value.get() == 8


async def test_run_all_is_capped_and_the_rest_coalesced(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 + timedelta(seconds=1))
    sid = await _create(
        pool,
        clock,
        cron="* * * * *",
        misfire="run_all",
        misfire_cap=3,
        misfire_grace="0s",
        overlap="allow",
    )
    clock.set(T0 + timedelta(minutes=10, seconds=30))
    await _scheduler(pool, clock).run_once()
    runs = await _runs(pool, sid)
    assert [r for r in runs if r[1] == "pending"] == [
        ("09:08:00", "pending", None, 0),
        ("09:09:00", "pending", None, 0),
        ("09:10:00", "pending", None, 0),
    ]
    assert [r for r in runs if r[1] == "skipped"] == [("09:07:00", "skipped", "misfire", 6)]


async def test_catchup_window_drops_slots_older_than_it(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 + timedelta(seconds=1))
    sid = await _create(
        pool,
        clock,
        cron="* * * * *",
        misfire="run_all",
        misfire_grace="0s",
        catchup_window="3m",
        overlap="allow",
    )
    clock.set(T0 + timedelta(minutes=10, seconds=30))
    metrics = Metrics()
    await _scheduler(pool, clock, metrics).run_once()
    assert [r[0] for r in await _runs(pool, sid) if r[1] == "pending"] == [
        "09:08:00",
        "09:09:00",
        "09:10:00",
    ]
    assert metrics.dropped_ticks.labels("catchup_window")._value.get() == 7


async def test_a_week_of_downtime_makes_few_rows(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 + timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *", misfire_grace="0s")
    clock.set(T0 + timedelta(days=7, seconds=30))
    await _scheduler(pool, clock).run_once()
    runs = await _runs(pool, sid)
    assert runs == [("09:00:00", "pending", None, 7 * 24 * 60 - 1)]


@pytest.mark.parametrize(
    ("policy", "statuses"),
    [
        pytest.param("skip", ["running", "skipped"], id="skip"),
        pytest.param("allow", ["running", "pending"], id="allow"),
        pytest.param("buffer_one", ["running", "pending", "skipped"], id="buffer_one"),
        pytest.param("buffer_all", ["running", "pending", "pending"], id="buffer_all"),
    ],
)
async def test_overlap_policies(pool: asyncpg.Pool[Any], policy: str, statuses: list[str]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *", overlap=policy)
    scheduler = _scheduler(pool, clock)
    clock.set(T0)
    await scheduler.run_once()
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt_id = gen_random_uuid(), "
        "lease_expires_at = $2 WHERE schedule_id = $1",
        sid,
        T0 + timedelta(hours=1),
    )
    for minute in (1, 2)[: len(statuses) - 1]:
        clock.set(T0 + timedelta(minutes=minute))
        await scheduler.run_once()
    rows = await pool.fetch(
        "SELECT status, skip_reason, serial FROM runs WHERE schedule_id = $1 ORDER BY slot", sid
    )
    assert [r["status"] for r in rows] == statuses
    assert all(r["skip_reason"] == "overlap" for r in rows if r["status"] == "skipped")
    assert all(r["serial"] == policy.startswith("buffer") for r in rows)


async def test_overlap_cancel_other_asks_the_running_run_to_stop(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *", overlap="cancel_other")
    scheduler = _scheduler(pool, clock)
    clock.set(T0)
    await scheduler.run_once()
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt_id = gen_random_uuid(), "
        "lease_expires_at = $2 WHERE schedule_id = $1",
        sid,
        T0 + timedelta(hours=1),
    )
    clock.set(T0 + timedelta(minutes=1))
    await scheduler.run_once()
    rows = await pool.fetch(
        "SELECT status, cancel_requested FROM runs WHERE schedule_id = $1 ORDER BY slot", sid
    )
    assert [(r["status"], r["cancel_requested"]) for r in rows] == [
        ("running", True),
        ("pending", False),
    ]


async def test_pause_stops_ticks_and_resume_applies_the_misfire_policy(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *", misfire="skip", misfire_grace="0s")
    scheduler = _scheduler(pool, clock)
    async with pool.acquire() as conn:
        await service.pause_schedule(conn, sid, owner="alice", actor="alice")
    clock.set(T0 + timedelta(minutes=5, seconds=30))
    assert (await scheduler.run_once()).schedules == 0
    assert await _runs(pool, sid) == []
    async with pool.acquire() as conn:
        await service.resume_schedule(conn, sid, owner="alice", actor="alice")
    await scheduler.run_once()
    assert await _runs(pool, sid) == [("09:05:00", "skipped", "misfire", 5)]
    actions = await pool.fetch(
        "SELECT action FROM schedule_changes WHERE schedule_id = $1 ORDER BY id", sid
    )
    assert [a["action"] for a in actions] == ["create", "pause", "resume"]


async def test_pause_until_resumes_by_itself(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *", misfire="run_once", misfire_grace="0s")
    scheduler = _scheduler(pool, clock)
    async with pool.acquire() as conn:
        await service.pause_schedule(
            conn, sid, owner=None, actor="ops", until=T0 + timedelta(minutes=3)
        )
    clock.set(T0 + timedelta(minutes=2, seconds=30))
    assert await scheduler.resume_due() == 0
    clock.set(T0 + timedelta(minutes=3, seconds=30))
    assert await scheduler.resume_due() == 1
    await scheduler.run_once()
    assert await _runs(pool, sid) == [("09:03:00", "pending", None, 3)]


async def test_an_edit_takes_effect_from_the_next_slot(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="*/10 * * * *")
    scheduler = _scheduler(pool, clock)
    clock.set(T0)
    await scheduler.run_once()  # 09:00 enqueued; cursor 09:10
    clock.set(T0 + timedelta(minutes=4))
    async with pool.acquire() as conn:
        row = await service.update_schedule(
            conn,
            clock,
            sid,
            {"cron": "*/5 * * * *"},
            owner="alice",
            actor="alice",
            providers=["echo"],
            expected_version=1,
        )
    assert row["next_fire_at"] == T0 + timedelta(minutes=5)
    assert row["version"] == 2
    clock.set(T0 + timedelta(minutes=10))
    await scheduler.run_once()
    assert [r[0] for r in await _runs(pool, sid)] == ["09:00:00", "09:05:00", "09:10:00"]
    async with pool.acquire() as conn:
        with pytest.raises(service.VersionConflict):
            await service.update_schedule(
                conn,
                clock,
                sid,
                {"name": "x"},
                owner="alice",
                actor="bob",
                providers=["echo"],
                expected_version=1,
            )
        with pytest.raises(service.NotFound):
            await service.update_schedule(
                conn,
                clock,
                sid,
                {"name": "x"},
                owner="mallory",
                actor="mallory",
                providers=["echo"],
            )
    change = await pool.fetchrow("SELECT * FROM schedule_changes WHERE action = 'update'")
    assert change["changes"]["expression"] == ["*/10 * * * *", "*/5 * * * *"]


async def test_trigger_and_backfill_never_collide_with_cadence_slots(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="0 * * * *")
    clock.set(T0)
    await _scheduler(pool, clock).run_once()  # cadence 09:00
    async with pool.acquire() as conn:
        manual = await service.trigger_schedule(conn, clock, sid, owner="alice", actor="alice")
        assert manual["origin"] == "manual" and manual["slot"] == T0
        created = await service.backfill_schedule(
            conn, clock, sid, T0 - timedelta(hours=3), T0, owner="alice", actor="alice"
        )
        again = await service.backfill_schedule(
            conn, clock, sid, T0 - timedelta(hours=3), T0, owner="alice", actor="alice"
        )
        with pytest.raises(service.ValidationError, match="past only"):
            await service.backfill_schedule(
                conn, clock, sid, T0, T0 + timedelta(hours=1), owner="alice", actor="alice"
            )
    # 06:00, 07:00, 08:00 backfilled; 09:00 already had its cadence run.
    assert [r["slot"].hour for r in created] == [6, 7, 8]
    assert again == []
    origins = await pool.fetch("SELECT origin, count(*) FROM runs GROUP BY origin ORDER BY 1")
    assert [(o["origin"], o["count"]) for o in origins] == [
        ("backfill", 3),
        ("cadence", 1),
        ("manual", 1),
    ]


async def test_pause_after_consecutive_dead_runs(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(
        pool,
        clock,
        cron="* * * * *",
        max_attempts=1,
        pause_after_failures=2,
        params={"fail_attempts": 9},
        overlap="allow",
    )
    scheduler = _scheduler(pool, clock)
    workers = factories.worker_pool(pool, clock)
    for minute in range(3):
        clock.set(T0 + timedelta(minutes=minute))
        await scheduler.run_once()
        await workers.run_once()
    schedule = await pool.fetchrow("SELECT * FROM schedules WHERE id = $1", sid)
    assert not schedule["enabled"]
    assert schedule["pause_reason"] == "paused after 2 consecutive dead runs"
    # Paused after the second dead run: the third minute made no run.
    assert [r[1] for r in await _runs(pool, sid)] == ["dead", "dead"]


async def test_jitter_delays_availability_deterministically(pool: asyncpg.Pool[Any]) -> None:
    from promptsched.schedule import jitter

    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *", jitter="30s")
    clock.set(T0)
    await _scheduler(pool, clock).run_once()
    row = await pool.fetchrow("SELECT slot, available_at FROM runs WHERE schedule_id = $1", sid)
    delay = row["available_at"] - row["slot"]
    assert timedelta(0) <= delay < timedelta(seconds=30)
    # Every replica computes the same offset for this (schedule, slot).
    assert delay == jitter.offset(sid, T0, timedelta(seconds=30))
    assert jitter.offset(sid, T0 + timedelta(minutes=1), timedelta(seconds=30)) != delay


async def test_overlap_skips_are_counted_as_dropped_ticks(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *")
    metrics = Metrics()
    scheduler = _scheduler(pool, clock, metrics)
    clock.set(T0)
    await scheduler.run_once()  # pending, never claimed: the next slot overlaps it
    clock.set(T0 + timedelta(minutes=1))
    await scheduler.run_once()
    assert [r[1:3] for r in await _runs(pool, sid)] == [("pending", None), ("skipped", "overlap")]
    assert metrics.dropped_ticks.labels("overlap")._value.get() == 1
    assert metrics.ticks.labels("skipped")._value.get() == 1
