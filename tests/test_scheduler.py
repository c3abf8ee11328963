"""The scheduler against real Postgres with a frozen clock: cadence, policies, controls."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest
from structlog.testing import capture_logs

from promptsched import errors, logs
from promptsched.clock import FrozenClock
from promptsched.config import SchedulerSettings
from promptsched.domain import Schedule
from promptsched.metrics import Metrics
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from promptsched.roles.scheduler import Scheduler
from promptsched.schedule import jitter, overlap, policies
from promptsched.schedule.spec import Spec
from promptsched.store import queries
from tests import factories
from tests.helpers import wait_until

T0 = datetime.fromisoformat("2026-03-02T09:00:00+00:00")


def _scheduler(
    pool: asyncpg.Pool[Any], clock: FrozenClock, metrics: Metrics | None = None, batch: int = 500
) -> Scheduler:
    # Every batch of the same size, unless a test is about the rush's larger ones.
    settings = SchedulerSettings(batch=batch, rush_batch=batch)
    return Scheduler(pool, clock, metrics or Metrics(), settings)


_NAMES = itertools.count(1)


async def _create(pool: asyncpg.Pool[Any], clock: FrozenClock, **raw: Any) -> int:
    named = {"name": f"s{next(_NAMES)}", "prompt": "p"}  # names are unique per owner
    values = inputs.validate({**named, **raw}, providers=["echo"])
    row = await schedule_ops.create_schedule(pool, clock, values, owner="alice")
    return row.id


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
        await schedule_ops.pause_schedule(conn, sid, owner="alice", actor="alice")
    clock.set(T0 + timedelta(minutes=5, seconds=30))
    assert (await scheduler.run_once()).schedules == 0
    assert await _runs(pool, sid) == []
    async with pool.acquire() as conn:
        await schedule_ops.resume_schedule(conn, sid, owner="alice", actor="alice")
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
        await schedule_ops.pause_schedule(
            conn, sid, owner=None, actor="ops", until=T0 + timedelta(minutes=3)
        )
    clock.set(T0 + timedelta(minutes=2, seconds=30))
    assert await scheduler.resume_due() == 0
    clock.set(T0 + timedelta(minutes=3, seconds=30))
    assert await scheduler.resume_due() == 1
    await scheduler.run_once()
    # The slots inside the pause are skipped; the first one after it runs (30 s late: the
    # scheduler came by then), standing for no missed slot.
    assert await _runs(pool, sid) == [
        ("09:00:00", "skipped", "paused", 0), ("09:01:00", "skipped", "paused", 0),
        ("09:02:00", "skipped", "paused", 0), ("09:03:00", "pending", None, 0),
    ]  # fmt: skip


async def test_an_edit_takes_effect_from_the_next_slot(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="*/10 * * * *")
    scheduler = _scheduler(pool, clock)
    clock.set(T0)
    await scheduler.run_once()  # 09:00 enqueued; cursor 09:10
    clock.set(T0 + timedelta(minutes=4))
    async with pool.acquire() as conn:
        row = await schedule_ops.update_schedule(
            conn,
            clock,
            sid,
            {"cron": "*/5 * * * *"},
            owner="alice",
            actor="alice",
            providers=["echo"],
            expected_version=1,
        )
    assert row.next_fire_at == T0 + timedelta(minutes=5)
    assert row.version == 2
    clock.set(T0 + timedelta(minutes=10))
    await scheduler.run_once()
    assert [r[0] for r in await _runs(pool, sid)] == ["09:00:00", "09:05:00", "09:10:00"]
    async with pool.acquire() as conn:
        with pytest.raises(errors.VersionConflict):
            await schedule_ops.update_schedule(
                conn,
                clock,
                sid,
                {"name": "x"},
                owner="alice",
                actor="bob",
                providers=["echo"],
                expected_version=1,
            )
        with pytest.raises(errors.NotFound):
            await schedule_ops.update_schedule(
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
        manual = await schedule_ops.trigger_schedule(conn, clock, sid, owner="alice", actor="alice")
        assert manual["origin"] == "manual" and manual["slot"] == T0
        created = await schedule_ops.backfill_schedule(
            conn, clock, sid, T0 - timedelta(hours=3), T0, owner="alice", actor="alice"
        )
        again = await schedule_ops.backfill_schedule(
            conn, clock, sid, T0 - timedelta(hours=3), T0, owner="alice", actor="alice"
        )
        with pytest.raises(errors.ValidationError, match="past only"):
            await schedule_ops.backfill_schedule(
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


# --- the batched write: one statement per batch, checked against the pure functions -----------


async def _grid(pool: asyncpg.Pool[Any], clock: FrozenClock) -> list[int]:
    """Every overlap policy with 0, 1 and 3 unfinished runs (the first running for half of
    them, some manual), under misfire settings that make multi-slot catch-ups, coalesced
    misfires, a catch-up window and jitter; plus other kinds and zones."""
    variants: list[dict[str, Any]] = [
        {"misfire": "run_all", "misfire_grace": "30s", "misfire_cap": 3},
        {"misfire": "run_once", "misfire_grace": "30s"},
        {"misfire": "skip", "misfire_grace": "0s", "jitter": "20s"},
        {"misfire": "run_once", "misfire_grace": "0s", "catchup_window": "90s"},
    ]
    sids = []
    for policy in overlap.POLICIES:
        for n, extra in enumerate(variants):
            for unfinished in (0, 1, 3):
                sid = await _create(pool, clock, cron="* * * * *", overlap=policy, **extra)
                sids.append(sid)
                for i in range(unfinished):
                    slot = T0 - timedelta(hours=1, minutes=i)
                    rid = await factories.pending_run(pool, sid, slot, "manual" if i else "cadence")
                    if i == 0 and n % 2 == 0:
                        await pool.execute(
                            "UPDATE runs SET status = 'running', attempt_id = gen_random_uuid(),"
                            " lease_expires_at = $2 WHERE id = $1",
                            rid,
                            T0 + timedelta(hours=1),
                        )
    for raw in (
        {"every": "90s", "overlap": "allow"},
        {"cron": "*/2 * * * *", "tz": "America/St_Johns", "misfire": "run_all"},
        {"rrule": "DTSTART:20260302T085900Z\nRRULE:FREQ=MINUTELY;INTERVAL=3", "jitter": "5s"},
        {"at": "2026-03-02T09:01:30+00:00"},
    ):
        sids.append(await _create(pool, clock, **raw))
    return sids


@dataclass
class _Expected:
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    cursors: dict[int, datetime | None] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    signalled: set[int] = field(default_factory=set)
    dropped: Counter[str] = field(default_factory=Counter)


async def _expected(pool: asyncpg.Pool[Any], sids: list[int], now: datetime) -> _Expected:
    """What the scheduler must write, computed schedule by schedule from the pure planning
    and overlap functions (the per-row path the batched statement replaced)."""
    expected = _Expected()
    runs = await pool.fetch("SELECT id, schedule_id, status FROM runs")
    for row in await pool.fetch("SELECT * FROM schedules WHERE id = ANY($1)", sids):
        sid = row["id"]
        spec = Spec(
            row["kind"], row["expression"], row["timezone"], row["dst_gap"], row["dst_fold"]
        )
        misfire = policies.Misfire(
            row["misfire_policy"], row["misfire_cap"], row["catchup_window"], row["misfire_grace"]
        )
        plan = policies.plan_tick(spec, row["next_fire_at"], now, misfire)
        mine = [r for r in runs if r["schedule_id"] == sid]
        looks = row["overlap_policy"] != "allow" and any(r.status == "pending" for r in plan.runs)
        decision = overlap.apply(
            row["overlap_policy"],
            pending=sum(r["status"] == "pending" for r in mine) if looks else 0,
            running=sum(r["status"] == "running" for r in mine) if looks else 0,
            planned=plan.runs,
        )
        expected.cursors[sid] = plan.next_fire_at
        expected.dropped.update(plan.dropped)
        serial = row["overlap_policy"] in ("buffer_one", "buffer_all")
        for run in decision.runs:
            delay = jitter.offset(sid, run.slot, row["jitter"]) if row["jitter"] else timedelta()
            expected.rows.append(
                (sid, run.slot, run.status, run.skip_reason, run.missed, run.slot + delay, serial)
            )
        if decision.cancel_unfinished:
            expected.cancelled |= {r["id"] for r in mine if r["status"] == "pending"}
            expected.signalled |= {r["id"] for r in mine if r["status"] == "running"}
    expected.rows.sort(key=lambda r: (r[0], r[1]))
    expected.dropped["overlap"] += sum(r[3] == "overlap" for r in expected.rows)
    expected.dropped["cancelled_by_overlap"] += len(expected.cancelled)
    return expected


@pytest.mark.parametrize("pipeline", [1, 2])
async def test_batches_write_what_the_per_schedule_functions_plan(
    pool: asyncpg.Pool[Any], pipeline: int
) -> None:
    """Batches of 7 that share a plan per group write the rows, cursors, cancellations and
    metrics that planning each schedule on its own gives."""
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sids = await _grid(pool, clock)
    existing = {r["id"]: r["status"] for r in await pool.fetch("SELECT id, status FROM runs")}
    now = T0 + timedelta(minutes=3, seconds=5)  # 09:00..09:03 due; 09:03 is on time
    expected = await _expected(pool, sids, now)
    assert expected.cancelled and expected.signalled  # the grid exercises cancel_other
    clock.set(now)
    metrics = Metrics()
    counts = await Scheduler(
        pool, clock, metrics, SchedulerSettings(batch=7, pipeline=pipeline, rush_batch=7)
    ).run_once()

    written = await pool.fetch(
        "SELECT schedule_id, slot, status, skip_reason, missed_slots, available_at, serial, "
        "created_at FROM runs WHERE id <> ALL($1) ORDER BY schedule_id, slot",
        [*existing],
    )
    assert [tuple(r)[:7] for r in written] == expected.rows
    assert all(r["created_at"] == now for r in written)
    cursors = await pool.fetch("SELECT id, next_fire_at FROM schedules")
    assert {r["id"]: r["next_fire_at"] for r in cursors} == expected.cursors
    for row in await pool.fetch("SELECT * FROM runs WHERE id = ANY($1)", [*existing]):
        if row["id"] in expected.cancelled:
            assert (row["status"], row["cancel_requested"]) == ("cancelled", False)
        else:
            assert row["status"] == existing[row["id"]]
            assert row["cancel_requested"] is (row["id"] in expected.signalled)

    enqueued = sum(r[2] == "pending" for r in expected.rows)
    skipped = len(expected.rows) - enqueued
    assert (counts.schedules, counts.enqueued, counts.skipped, counts.duplicates) == (
        len(sids),
        enqueued,
        skipped,
        0,
    )
    assert counts.dropped == expected.dropped
    assert metrics.ticks.labels("enqueued")._value.get() == enqueued
    assert metrics.ticks.labels("skipped")._value.get() == skipped
    for reason, number in expected.dropped.items():
        assert metrics.dropped_ticks.labels(reason)._value.get() == number, reason
    lag = {s.name: s.value for s in next(iter(metrics.tick_lag.collect())).samples}
    pending = [(now - r[1]).total_seconds() for r in expected.rows if r[2] == "pending"]
    assert lag["promptsched_tick_lag_seconds_count"] == enqueued
    assert lag["promptsched_tick_lag_seconds_sum"] == pytest.approx(sum(pending))


def test_overlap_decisions_only_tell_0_1_and_2_or_more_unfinished_runs_apart() -> None:
    """schedule_take_due caps the unfinished count at 2 and passes it as `pending`."""
    planned = tuple(
        policies.PlannedRun(T0 + timedelta(minutes=i), "pending", None, 0) for i in range(4)
    )
    for policy in overlap.POLICIES:
        for pending in range(5):
            for running in range(5):
                capped = min(pending + running, 2)
                assert overlap.apply(
                    policy, pending=pending, running=running, planned=planned
                ) == overlap.apply(policy, pending=capped, running=0, planned=planned)


async def test_a_slot_that_already_has_its_run_is_a_counted_duplicate(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *", overlap="allow")
    await factories.pending_run(pool, sid, T0)  # as if another scheduler had written it
    clock.set(T0)
    metrics = Metrics()
    counts = await _scheduler(pool, clock, metrics).run_once()
    assert (counts.schedules, counts.enqueued, counts.duplicates) == (1, 0, 1)
    assert metrics.ticks.labels("duplicate")._value.get() == 1
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1
    assert await pool.fetchval("SELECT next_fire_at FROM schedules WHERE id = $1", sid) == (
        T0 + timedelta(minutes=1)
    )


async def test_an_edit_waits_for_the_batch_that_holds_the_schedule(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch keeps its schedules locked from planning to commit: an edit made meanwhile
    waits, then lands on the advanced cursor; the plan is never applied to an edited row."""
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="*/10 * * * *")
    clock.set(T0)
    planned, release = anyio.Event(), anyio.Event()
    real = queries.schedule_tick

    async def held(*args: Any, **kwargs: Any) -> Any:
        planned.set()
        await release.wait()
        return await real(*args, **kwargs)

    monkeypatch.setattr(queries, "schedule_tick", held)
    edited: list[Schedule] = []

    async def edit() -> None:
        async with pool.acquire() as conn:
            edited.append(
                await schedule_ops.update_schedule(
                    conn,
                    clock,
                    sid,
                    {"cron": "*/5 * * * *"},
                    owner="alice",
                    actor="alice",
                    providers=["echo"],
                )
            )

    async def editor_waits() -> bool:
        return bool(
            await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )

    scheduler = _scheduler(pool, clock)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(scheduler.run_once)
            await planned.wait()
            tg.start_soon(edit)
            await wait_until(editor_waits, timeout=10, interval=0.005, what="the edit to wait")
            assert not edited
            release.set()
    monkeypatch.setattr(queries, "schedule_tick", real)
    assert await _runs(pool, sid) == [("09:00:00", "pending", None, 0)]
    # The edit read the advanced cursor (09:10) and moved it back to the new expression's
    # first slot at or after now: 09:00, whose run exists. The next tick writes no second row.
    assert edited[0].version == 2 and edited[0].next_fire_at == T0
    counts = await scheduler.run_once()
    assert (counts.enqueued, counts.duplicates) == (0, 1)
    assert await _runs(pool, sid) == [("09:00:00", "pending", None, 0)]
    assert await pool.fetchval("SELECT next_fire_at FROM schedules WHERE id = $1", sid) == (
        T0 + timedelta(minutes=5)
    )


async def test_a_failed_write_rolls_the_batch_back_and_the_next_tick_retries(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock(T0 - timedelta(seconds=1))
    sid = await _create(pool, clock, cron="* * * * *")
    clock.set(T0)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("write failed")

    monkeypatch.setattr(queries, "schedule_tick", broken)
    scheduler = _scheduler(pool, clock)
    with pytest.raises(RuntimeError, match="write failed"):
        await scheduler.run_once()
    assert await _runs(pool, sid) == []
    assert await pool.fetchval("SELECT next_fire_at FROM schedules WHERE id = $1", sid) == T0
    monkeypatch.undo()
    assert (await scheduler.run_once()).enqueued == 1
    assert await _runs(pool, sid) == [("09:00:00", "pending", None, 0)]


async def test_a_full_batch_starts_the_next_one_while_it_writes(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rush pipeline: the first batch holds its write until the second has locked its
    own schedules, so both are in flight at once; SKIP LOCKED keeps them disjoint."""
    clock = FrozenClock(T0 - timedelta(seconds=1))
    ids = [await _create(pool, clock, cron="* * * * *") for _ in range(25)]
    clock.set(T0)
    taken: list[list[int]] = []
    second_took = anyio.Event()
    real_take, real_tick = queries.schedule_take_due, queries.schedule_tick

    async def take(*args: Any, **kwargs: Any) -> Any:
        groups = await real_take(*args, **kwargs)
        taken.append([sid for g in groups for sid in g.ids])
        if len(taken) == 2:
            second_took.set()
        return groups

    async def tick(conn: Any, now: Any, write: Any, **kwargs: Any) -> Any:
        if write.schedule_ids == taken[0]:
            with anyio.fail_after(10):
                await second_took.wait()  # the first batch still holds its locks
        return await real_tick(conn, now, write, **kwargs)

    monkeypatch.setattr(queries, "schedule_take_due", take)
    monkeypatch.setattr(queries, "schedule_tick", tick)
    metrics = Metrics()
    counts = await _scheduler(pool, clock, metrics, batch=10).run_once()
    assert [len(t) for t in taken] == [10, 10, 5]
    assert sorted(sid for t in taken for sid in t) == sorted(ids)
    assert (counts.schedules, counts.enqueued) == (25, 25)
    assert metrics.ticks.labels("enqueued")._value.get() == 25
    rows = await pool.fetch("SELECT schedule_id, slot FROM runs")
    assert sorted(r["schedule_id"] for r in rows) == sorted(ids)


async def test_the_batches_after_a_full_one_take_the_rush_batch(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick's first batch is small, so a rush's first runs are written soon; once one comes
    back full, the rest of the rush goes in batches of ``rush_batch``."""
    clock = FrozenClock(T0 - timedelta(seconds=1))
    ids = [await _create(pool, clock, cron="* * * * *") for _ in range(45)]
    clock.set(T0)
    limits: list[int] = []
    real_take = queries.schedule_take_due

    async def take(conn: Any, now: Any, limit: int, held: int) -> Any:
        limits.append(limit)
        return await real_take(conn, now, limit, held)

    monkeypatch.setattr(queries, "schedule_take_due", take)
    settings = SchedulerSettings(batch=10, rush_batch=20, pipeline=1)
    counts = await Scheduler(pool, clock, Metrics(), settings).run_once()
    # 10, then 20 and 15 of the rest: the last came back short and ended the rush.
    assert limits == [10, 20, 20]
    assert (counts.schedules, counts.enqueued) == (45, 45)
    rows = await pool.fetch("SELECT schedule_id FROM runs")
    assert sorted(r["schedule_id"] for r in rows) == sorted(ids)
    # A quiet tick takes the small batch only.
    assert (await Scheduler(pool, clock, Metrics(), settings).run_once()).schedules == 0
    assert limits == [10, 20, 20, 10]


@pytest.mark.parametrize("level", ["debug", "info"])
async def test_each_run_row_is_logged_at_its_level(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    """A skipped tick is logged at info with its ids; an enqueued one at debug, and the batch
    statement returns the enqueued rows only when debug lines are written."""
    clock = FrozenClock(T0 - timedelta(seconds=1))
    busy = await _create(pool, clock, cron="* * * * *")
    await factories.pending_run(pool, busy, T0 - timedelta(hours=1))
    free = await _create(pool, clock, cron="* * * * *")
    clock.set(T0)
    monkeypatch.setattr(logs, "_threshold", logs._LEVELS[level])
    with capture_logs() as lines:
        await _scheduler(pool, clock).run_once()
    runs = {r["schedule_id"]: r["id"] for r in await pool.fetch("SELECT * FROM runs")}
    rows = [line for line in lines if line["event"] in ("run.enqueued", "run.skipped")]
    expected = [
        {
            "event": "run.skipped",
            "log_level": "info",
            "run_id": runs[busy],
            "schedule_id": busy,
            "slot": T0.isoformat(),
            "skip_reason": "overlap",
            "missed_slots": 0,
        }
    ]
    if level == "debug":
        expected.append(
            {
                "event": "run.enqueued",
                "log_level": "debug",
                "run_id": runs[free],
                "schedule_id": free,
                "slot": T0.isoformat(),
                "skip_reason": None,
                "missed_slots": 0,
            }
        )
    assert sorted(rows, key=lambda r: r["event"], reverse=True) == expected


async def test_a_schedule_whose_fire_times_cannot_be_computed_is_paused_not_the_batch(
    pool: asyncpg.Pool[Any],
) -> None:
    # Rows an older version accepted (a zone the installed tzdata lacks, an expression the
    # parser no longer reads) fail to plan on every tick; they must not hold back the rest.
    clock = FrozenClock(T0 - timedelta(seconds=1))
    good = [await _create(pool, clock, cron="* * * * *") for _ in range(3)]
    zone = await _create(pool, clock, cron="* * * * *")
    expression = await _create(pool, clock, cron="*/5 * * * *")
    await pool.execute("UPDATE schedules SET timezone = 'Mars/Olympus' WHERE id = $1", zone)
    await pool.execute(
        "UPDATE schedules SET expression = 'every tuesday' WHERE id = $1", expression
    )
    clock.set(T0)
    metrics = Metrics()
    scheduler = _scheduler(pool, clock, metrics)
    with capture_logs() as logged:
        counts = await scheduler.run_once()
    assert counts.enqueued == 3
    for sid in good:
        assert await _runs(pool, sid) == [("09:00:00", "pending", None, 0)]
    paused = await pool.fetch(
        "SELECT id, enabled, pause_reason FROM schedules WHERE id = ANY($1::bigint[]) ORDER BY id",
        [zone, expression],
    )
    assert [(r["id"], r["enabled"]) for r in paused] == [(zone, False), (expression, False)]
    assert "Mars/Olympus" in paused[0]["pause_reason"]
    assert "fire times could not be computed" in paused[1]["pause_reason"]
    changes = await pool.fetch(
        "SELECT schedule_id, actor, action FROM schedule_changes "
        "WHERE action = 'auto_pause' ORDER BY schedule_id"
    )
    assert [tuple(c) for c in changes] == [
        (zone, "promptsched", "auto_pause"),
        (expression, "promptsched", "auto_pause"),
    ]
    assert metrics.role_errors.labels("scheduler")._value.get() == 2
    events = [e for e in logged if e["event"] == "scheduler.schedules_paused"]
    assert sorted(sid for e in events for sid in e["schedule_ids"]) == [zone, expression]
    # The paused ones stay out of later ticks; the good ones keep their cadence.
    clock.set(T0 + timedelta(minutes=1))
    assert (await scheduler.run_once()).schedules == 3
    assert metrics.role_errors.labels("scheduler")._value.get() == 2
    assert await _runs(pool, zone) == [] and await _runs(pool, expression) == []
