"""Misfire planning and jitter: which due slots become rows, in bounded work."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from promptsched.errors import ValidationError
from promptsched.schedule import fire_times, jitter, policies, spec
from promptsched.schedule.policies import Misfire, PlannedRun

MINUTELY = spec.parse("cron", "* * * * *")
T0 = datetime(2026, 1, 8, 12, 0, tzinfo=UTC)  # a minutely slot
MIN = timedelta(minutes=1)


def pending(slot: datetime, missed: int = 0) -> PlannedRun:
    return PlannedRun(slot, "pending", None, missed)


def skipped(slot: datetime, reason: str, missed: int) -> PlannedRun:
    return PlannedRun(slot, "skipped", reason, missed)


@pytest.fixture
def next_after_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts next_after calls: planning must not walk every missed slot."""
    calls = [0]
    real = fire_times.next_after

    def counting(s: spec.Spec, after: datetime) -> datetime | None:
        calls[0] += 1
        return real(s, after)

    monkeypatch.setattr(fire_times, "next_after", counting)
    yield calls


def test_on_time_slot_becomes_one_pending_run() -> None:
    plan = policies.plan_tick(MINUTELY, T0, T0 + timedelta(seconds=2), Misfire())
    assert plan.runs == (pending(T0),)
    assert plan.next_fire_at == T0 + MIN
    assert dict(plan.dropped) == {}


def test_nothing_due_yet() -> None:
    plan = policies.plan_tick(MINUTELY, T0 + MIN, T0 + timedelta(seconds=30), Misfire())
    assert plan.runs == ()
    assert plan.next_fire_at == T0 + MIN


def test_grace_boundary_is_on_time_and_one_microsecond_more_is_late() -> None:
    grace = Misfire(grace=timedelta(seconds=30))
    on_time = policies.plan_tick(MINUTELY, T0, T0 + timedelta(seconds=30), grace)
    assert on_time.runs == (pending(T0),)
    late = policies.plan_tick(MINUTELY, T0, T0 + timedelta(seconds=30, microseconds=1), grace)
    assert late.runs == (pending(T0, missed=0),)  # run_once runs the latest late slot
    skip = Misfire(policy="skip", grace=timedelta(seconds=30))
    late_skip = policies.plan_tick(MINUTELY, T0, T0 + timedelta(seconds=30, microseconds=1), skip)
    assert late_skip.runs == (skipped(T0, "misfire", 0),)


def test_run_once_runs_latest_late_slot_and_records_missed() -> None:
    now = T0 + 9 * MIN + timedelta(seconds=59)  # slots T0 .. T0+9m, all older than 10 s
    plan = policies.plan_tick(MINUTELY, T0, now, Misfire(grace=timedelta(seconds=10)))
    assert plan.runs == (pending(T0 + 9 * MIN, missed=9),)
    assert dict(plan.dropped) == {"misfire": 9}
    assert plan.next_fire_at == T0 + 10 * MIN


def test_run_once_with_on_time_slot_coalesces_late_ones_into_skipped_row() -> None:
    now = T0 + 10 * MIN + timedelta(seconds=5)  # T0+10m is on time; T0 .. T0+9m late
    plan = policies.plan_tick(MINUTELY, T0, now, Misfire())
    assert plan.runs == (skipped(T0 + 9 * MIN, "misfire", 9), pending(T0 + 10 * MIN))
    assert dict(plan.dropped) == {"misfire": 10}


def test_skip_keeps_history_of_dropped_ticks() -> None:
    now = T0 + 9 * MIN + timedelta(seconds=59)
    plan = policies.plan_tick(MINUTELY, T0, now, Misfire(policy="skip", grace=timedelta(0)))
    assert plan.runs == (skipped(T0 + 9 * MIN, "misfire", 9),)
    assert dict(plan.dropped) == {"misfire": 10}


def test_run_all_runs_the_latest_cap_and_coalesces_the_rest() -> None:
    now = T0 + 4 * MIN + timedelta(seconds=59)  # 5 late slots
    plan = policies.plan_tick(MINUTELY, T0, now, Misfire(policy="run_all", cap=3, grace=MIN / 2))
    assert plan.runs == (
        skipped(T0 + MIN, "misfire", 1),
        pending(T0 + 2 * MIN),
        pending(T0 + 3 * MIN),
        pending(T0 + 4 * MIN),
    )
    assert dict(plan.dropped) == {"misfire": 2}


def test_run_all_under_cap_runs_everything() -> None:
    now = T0 + 2 * MIN + timedelta(seconds=5)
    plan = policies.plan_tick(MINUTELY, T0, now, Misfire(policy="run_all"))
    assert plan.runs == (pending(T0), pending(T0 + MIN), pending(T0 + 2 * MIN))
    assert dict(plan.dropped) == {}


def test_catchup_window_drops_old_slots_into_one_skipped_row() -> None:
    now = T0 + 59 * MIN + timedelta(seconds=5)  # 60 slots due, the last one on time
    misfire = Misfire(policy="run_all", catchup_window=timedelta(minutes=10))
    plan = policies.plan_tick(MINUTELY, T0, now, misfire)
    # slots older than now - 10m (T0 .. T0+49m) never run; T0+50m .. T0+59m do
    assert plan.runs[0] == skipped(T0 + 49 * MIN, "catchup_window", 49)
    assert [r.slot for r in plan.runs[1:]] == [T0 + m * MIN for m in range(50, 60)]
    assert all(r.status == "pending" for r in plan.runs[1:])
    assert dict(plan.dropped) == {"catchup_window": 50}


def test_week_of_minutely_downtime_is_planned_in_bounded_work(next_after_calls: list[int]) -> None:
    due_from = datetime(2026, 3, 5, 0, 0, tzinfo=UTC)
    now = due_from + timedelta(days=7, seconds=20)  # 10_081 slots due; the last on time
    assert fire_times.count_between(MINUTELY, due_from, now, limit=10**6) == (10_081, True)
    plan = policies.plan_tick(MINUTELY, due_from, now, Misfire())
    assert plan.runs == (
        skipped(now - timedelta(seconds=20) - MIN, "misfire", 10_079),
        pending(now - timedelta(seconds=20)),
    )
    assert dict(plan.dropped) == {"misfire": 10_080}
    assert next_after_calls[0] < 20  # counted in closed form, not walked slot by slot


def test_week_of_downtime_run_all_lists_only_cap_rows(next_after_calls: list[int]) -> None:
    s = spec.parse("cron", "* * * * *", "America/New_York")  # the week holds a DST change
    due_from = datetime(2026, 3, 5, 0, 0, tzinfo=UTC)
    now = due_from + timedelta(days=7) - timedelta(seconds=30)
    plan = policies.plan_tick(s, due_from, now, Misfire(policy="run_all", cap=50))
    # one skipped row for the oldest, 50 late runs, and the on-time slot 30 s ago
    assert len(plan.runs) == 52
    assert plan.runs[0].missed + 1 + 50 + 1 == 7 * 1440
    assert dict(plan.dropped) == {"misfire": 7 * 1440 - 51}
    assert next_after_calls[0] < 200


def test_year_of_every_second_downtime_is_closed_form(next_after_calls: list[int]) -> None:
    s = spec.parse("every", "1s")
    due_from = datetime(2025, 1, 1, tzinfo=UTC)
    now = datetime(2026, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)
    plan = policies.plan_tick(s, due_from, now, Misfire(policy="skip", grace=timedelta(0)))
    assert plan.runs == (skipped(now.replace(microsecond=0), "misfire", 365 * 86400),)
    assert next_after_calls[0] < 100


def test_rrule_downtime_counts_exactly() -> None:
    s = spec.parse("rrule", "DTSTART:20260101T000000\nRRULE:FREQ=MINUTELY;INTERVAL=15")
    now = datetime(2026, 1, 2, 0, 0, 10, tzinfo=UTC)
    plan = policies.plan_tick(s, datetime(2026, 1, 1, tzinfo=UTC), now, Misfire())
    assert plan.runs == (
        skipped(datetime(2026, 1, 1, 23, 45, tzinfo=UTC), "misfire", 95),
        pending(datetime(2026, 1, 2, tzinfo=UTC)),
    )


def test_one_shot_at_runs_once_then_has_no_next_fire() -> None:
    s = spec.parse("at", "2026-01-08T12:00:00Z")
    plan = policies.plan_tick(s, T0, T0 + timedelta(hours=5), Misfire())
    assert plan.runs == (pending(T0),)
    assert plan.next_fire_at is None


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"policy": "later"}, id="policy"),
        pytest.param({"cap": 0}, id="cap"),
        pytest.param({"grace": timedelta(seconds=-1)}, id="grace"),
        pytest.param({"catchup_window": timedelta(0)}, id="window"),
    ],
)
def test_misfire_rejects_bad_settings(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        Misfire(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == "misfire"


def test_jitter_is_deterministic_and_in_range() -> None:
    max_jitter = timedelta(minutes=5)
    offsets = {jitter.offset(7, T0 + n * MIN, max_jitter) for n in range(200)}
    assert all(timedelta(0) <= o < max_jitter for o in offsets)
    assert len(offsets) > 190  # spread out, not constant
    assert jitter.offset(7, T0, max_jitter) == jitter.offset(7, T0, max_jitter)
    paris = T0.astimezone(spec.load_zone("Europe/Paris"))
    assert jitter.offset(7, paris, max_jitter) == jitter.offset(7, T0, max_jitter)
    assert jitter.offset(8, T0, max_jitter) != jitter.offset(7, T0, max_jitter)
    assert jitter.offset(7, T0, timedelta(0)) == timedelta(0)


def test_plan_tick_reads_local_instants_as_instants() -> None:
    """`local - grace` would be wall-clock arithmetic; the plan must use real time."""
    ny = spec.load_zone("America/New_York")
    s = spec.parse("cron", "0 * * * *", "America/New_York")  # real time: both 01:00s fire
    first_pass = datetime(2026, 11, 1, 1, 0, tzinfo=ny)  # 01:00 EDT = 05:00Z
    now = datetime(2026, 11, 1, 1, 0, 30, fold=1, tzinfo=ny)  # 01:00:30 EST = 06:00:30Z
    plan = policies.plan_tick(s, first_pass, now, Misfire())
    assert plan.runs == (
        skipped(datetime(2026, 11, 1, 5, 0, tzinfo=UTC), "misfire", 0),
        pending(datetime(2026, 11, 1, 6, 0, tzinfo=UTC)),
    )
    assert plan.next_fire_at == datetime(2026, 11, 1, 7, 0, tzinfo=UTC)
