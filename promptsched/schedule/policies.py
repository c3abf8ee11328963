"""Misfire planning: which of the slots that fell due become run rows, in bounded work."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Literal, get_args

from promptsched.domain import RunStatus
from promptsched.errors import ValidationError
from promptsched.schedule import fire_times, spec

MisfirePolicy = Literal["run_once", "skip", "run_all"]
SkipReason = Literal["misfire", "catchup_window", "paused"]
POLICIES: tuple[str, ...] = get_args(MisfirePolicy)
_COUNT_LIMIT = 1_000_000_000  # cron and `every` count in closed form; this only bounds RRULE work
_US = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Misfire:
    """What to do with slots found late (after downtime, on resume, after a slow tick)."""

    policy: MisfirePolicy = "run_once"
    cap: int = 100  # run_all: at most this many runs per catch-up; the rest are coalesced
    catchup_window: timedelta | None = None  # slots older than now - window never run
    grace: timedelta = timedelta(seconds=60)  # a slot at most this late still counts as on time

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValidationError(
                "misfire", f"unknown misfire policy {self.policy!r}; use {POLICIES}"
            )
        if self.cap < 1:
            raise ValidationError("misfire", f"cap must be at least 1, not {self.cap}")
        if self.grace < timedelta(0):
            raise ValidationError("misfire", "grace must not be negative")
        if self.catchup_window is not None and self.catchup_window <= timedelta(0):
            raise ValidationError("misfire", "catchup_window must be positive")


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """One row the scheduler inserts for a slot."""

    slot: datetime  # aware UTC
    status: RunStatus  # PENDING or SKIPPED
    skip_reason: str | None  # "misfire" | "catchup_window" | "paused" | None
    missed: int  # how many OTHER slots this row stands for (coalesced), 0 normally


@dataclass(frozen=True, slots=True)
class TickPlan:
    """The rows of one tick, the schedule's new cursor, and what was dropped (for metrics)."""

    runs: tuple[PlannedRun, ...]  # ordered by slot
    next_fire_at: datetime | None  # first fire strictly after `now`
    dropped: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def plan_tick(s: spec.Spec, due_from: datetime, now: datetime, misfire: Misfire) -> TickPlan:
    """Plan the rows for the fire times in [due_from, now] (due_from: the stored cursor).

    Slots at or after `now - grace` are on time and each becomes a pending run (the latest
    `cap` of them; more than `cap` on-time slots means grace spans more than `cap` periods,
    and the older ones are treated as late). Slots older than `now - catchup_window` never run:
    one skipped row (reason "catchup_window") stands for all of them. The remaining late slots
    follow the policy:

    * run_once: one pending run for the latest late slot, `missed` = the other late slots. If
      on-time slots exist too, they run instead and the late ones become one skipped "misfire"
      row, so a catch-up never runs the schedule twice for the same moment.
    * skip: one skipped "misfire" row at the latest late slot standing for all of them.
    * run_all: the latest `cap` late slots run; older ones become one skipped "misfire" row.

    Work is bounded: slots are counted (closed form for cron and `every`), never walked, and at
    most `cap` + 2 of them are listed, so a week of minutely downtime plans in milliseconds.
    """
    plan = _Planner(s, misfire)
    due_from, now = due_from.astimezone(UTC), now.astimezone(UTC)  # no wall-clock arithmetic
    next_fire = fire_times.next_after(s, now)
    if due_from > now:
        return TickPlan((), next_fire)
    cutoff = (
        due_from if misfire.catchup_window is None else max(due_from, now - misfire.catchup_window)
    )
    on_start = max(cutoff, now - misfire.grace)
    plan.coalesce(due_from, cutoff - _US, "catchup_window")
    on_time = fire_times.last_between(s, on_start, now, misfire.cap)
    if len(on_time) == misfire.cap:  # maybe more: the older on-time ones count as late
        on_start = on_time[0]
    plan.late(cutoff, on_start - _US, has_on_time=bool(on_time))
    plan.runs.extend(PlannedRun(slot, RunStatus.PENDING, None, 0) for slot in on_time)
    return TickPlan(tuple(plan.runs), next_fire, MappingProxyType(dict(plan.dropped)))


@dataclass
class _Planner:
    spec: spec.Spec
    misfire: Misfire
    runs: list[PlannedRun] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    def count(self, start: datetime, end: datetime) -> int:
        return fire_times.count_between(self.spec, start, end, limit=_COUNT_LIMIT)[0]

    def coalesce(self, start: datetime, end: datetime, reason: SkipReason) -> None:
        """One skipped row at the latest slot in [start, end], standing for all of them."""
        total = self.count(start, end)
        if total:
            latest = fire_times.last_between(self.spec, start, end, 1)[0]
            self.runs.append(PlannedRun(latest, RunStatus.SKIPPED, reason, total - 1))
            self.dropped[reason] = self.dropped.get(reason, 0) + total

    def late(self, start: datetime, end: datetime, *, has_on_time: bool) -> None:
        policy = self.misfire.policy
        if policy == "skip" or (policy == "run_once" and has_on_time):
            self.coalesce(start, end, "misfire")
        elif policy == "run_once":
            total = self.count(start, end)
            if total:
                latest = fire_times.last_between(self.spec, start, end, 1)[0]
                self.runs.append(PlannedRun(latest, RunStatus.PENDING, None, total - 1))
                if total > 1:
                    self.dropped["misfire"] = total - 1
        else:
            slots = fire_times.last_between(self.spec, start, end, self.misfire.cap)
            if slots:
                self.coalesce(start, slots[0] - _US, "misfire")
            self.runs.extend(PlannedRun(slot, RunStatus.PENDING, None, 0) for slot in slots)


@dataclass(frozen=True, slots=True)
class PauseEnd:
    """What ends a pause with an end: the skipped rows of the slots inside it, and the cursor
    of the first slot at or after its end."""

    runs: tuple[PlannedRun, ...]  # ordered by slot, each SKIPPED with reason "paused"
    next_fire_at: datetime | None


def plan_pause_end(s: spec.Spec, cursor: datetime | None, until: datetime, cap: int) -> PauseEnd:
    """The slots in [cursor, until) were inside a pause the user gave an end: none of them
    runs. The latest ``cap`` each get a skipped row (reason "paused"), older ones one row that
    stands for them all, so the history shows every one in bounded work; the schedule then
    fires from the first slot at or after ``until``, on time, with no catch-up and nothing
    left to overlap with. Slots found after ``until`` (a scheduler that was down) are the
    misfire policy's, as any late slot."""
    if cursor is None:
        return PauseEnd((), None)
    cursor, until = cursor.astimezone(UTC), until.astimezone(UTC)
    nxt = fire_times.next_after(s, until - _US)
    if cursor >= until:
        return PauseEnd((), cursor)
    plan = _Planner(s, Misfire(cap=max(1, cap)))
    slots = fire_times.last_between(s, cursor, until - _US, plan.misfire.cap)
    if slots:
        plan.coalesce(cursor, slots[0] - _US, "paused")
    plan.runs.extend(PlannedRun(slot, RunStatus.SKIPPED, "paused", 0) for slot in slots)
    return PauseEnd(tuple(plan.runs), nxt)
