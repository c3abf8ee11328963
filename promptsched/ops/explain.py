"""Why a schedule did (or will) fire or not at an instant, reasoned from the schedule, its
change history and the runs around that slot, so operators need not read logs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from promptsched import durations
from promptsched.domain import ChangeAction, RunOrigin, RunStatus, Schedule
from promptsched.errors import ValidationError
from promptsched.human import times
from promptsched.ops import validate, views
from promptsched.schedule import fire_times, spec, zone

TIMING = ("kind", "expression", "timezone", "dst_gap", "dst_fold")
LOOKBACK = timedelta(days=5 * 366)
_US = timedelta(microseconds=1)
_FLOOR = datetime(1970, 1, 1, tzinfo=UTC)
_RUN_VERDICTS = {
    RunStatus.SUCCEEDED: "ran",
    RunStatus.DEAD: "failed",
    RunStatus.CANCELLED: "cancelled",
    RunStatus.SKIPPED: "skipped",
    RunStatus.PENDING: "in_progress",
    RunStatus.RUNNING: "in_progress",
}
_SKIP_REASONS = {
    "overlap": "an earlier run was still unfinished (overlap policy)",
    "misfire": "the slot was found late and the misfire policy dropped it",
    "disabled": "the schedule was paused when a worker picked the run up",
    "paused": "it fell inside a pause with an end, whose slots are skipped",
}

Row = asyncpg.Record


@dataclass(frozen=True, slots=True)
class Facts:
    schedule: Schedule
    at: datetime
    now: datetime
    changes: Sequence[Row]  # schedule_change_around: the state at `at`, then later edits
    runs: Sequence[Row]  # run_list_for_slot: position 'at', 'after' or 'before'
    # History retention (PROMPTSCHED_RETENTION; None: finished runs are kept forever). A
    # finished run is purged once it finished longer ago than this, and it finished after its
    # slot, so a slot newer than ``now - retention`` still has every row it ever had.
    retention: timedelta | None = None
    note: str | None = None  # resolve_at's note on a local time DST skipped or repeated


def spec_at(schedule: Schedule, changes: Sequence[Row]) -> spec.Spec:
    """The expression in force at the instant: the current one with later edits undone."""
    timing = {key: getattr(schedule, key) for key in TIMING}
    for edit in (c for c in changes if c["later"]):  # newest first
        for key in TIMING:
            pair = (edit["changes"] or {}).get(key)
            if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str):
                timing[key] = pair[0]
    return spec.Spec(**timing)


def _state(changes: Sequence[Row]) -> Row | None:
    return next((c for c in changes if not c["later"]), None)


def _paused_by(state: Row | None) -> bool:
    if state is None:
        return False
    if state["action"] == ChangeAction.CREATE:
        fields = (state["changes"] or {}).get("fields") or {}
        return fields.get("enabled") is False
    return state["action"] in (ChangeAction.PAUSE, ChangeAction.AUTO_PAUSE)


def _local(s: spec.Spec, t: datetime) -> str:
    """``2026-03-08 03:00 EDT (America/New_York)``: as people read the slot."""
    return times.local(t, s.timezone) + times.zone_words(s.timezone)


def _at(row: Schedule, t: datetime) -> str:
    return times.local(t, row.timezone)


def resolve_at(text: str, row: Schedule, field: str = "at") -> tuple[datetime, str | None]:
    """The instant a user means by ``text`` (ISO-8601; without an offset, a local time in the
    schedule's zone), and a note when that local time is not one instant: a time a DST gap
    skipped names the real fire time, the first instant after the gap (as the schedule's
    ``dst_gap`` shift fires it); a repeated one is read as its first occurrence."""
    where = spec.load_zone(row.timezone)
    value = validate.instant(text, field, zone=where)
    if datetime.fromisoformat(text.strip()).tzinfo is not None:
        return value, None
    local = value.replace(tzinfo=None)
    found = zone.locate(where, local)
    said = local.strftime("%H:%M:%S" if local.second else "%H:%M")
    day = local.strftime("%Y-%m-%d")
    if found.kind == zone.GAP:
        fired = times.local(found.first, where)
        shifted = (
            f"a slot due then fires at {fired}, the first instant after the gap"
            if row.dst_gap == "shift"
            else f"this schedule skips slots in a gap (dst_gap skip); the gap ended at {fired}"
        )
        return found.first, f"{said} did not exist on {day} in {row.timezone} (DST): {shifted}."
    if found.kind == zone.FOLD:
        first = times.local(found.first, where)
        return found.first, (
            f"{said} occurred twice on {day} in {row.timezone} (DST): this is the first, "
            f"{first}; give a UTC offset for the second."
        )
    return found.first, None


def _describe_run(run: Row) -> str:
    status = run["status"]
    text = f"run {run['id']} ({run['origin']}) for this slot "
    if status == RunStatus.SKIPPED:
        reason = _SKIP_REASONS.get(run["skip_reason"], run["skip_reason"])
        missed = (
            f"; it stands for {run['missed_slots']} earlier missed slots"
            if run["missed_slots"]
            else ""
        )
        return text + f"was skipped: {reason}{missed}"
    if status in (RunStatus.PENDING, RunStatus.RUNNING):
        return text + f"is {status}"
    detail = f": {run['error']}" if run["error"] and status != RunStatus.SUCCEEDED else ""
    decision = run["notify_decision"] if status == RunStatus.SUCCEEDED else None
    if isinstance(decision, dict):  # a monitor's success: whether it notified, and why
        told = "notified its targets" if decision.get("notify") else "did not notify"
        detail = f"; it {told}: {decision.get('reason')}"
    return text + f"{status} after {run['attempts']} attempt(s){detail}"


def _covered_by(s: spec.Spec, at: datetime, after: Row | None) -> bool:
    """Whether a later cadence run stands for this slot (missed slots coalesced into it)."""
    if after is None or not after["missed_slots"]:
        return False
    missed = int(after["missed_slots"])
    count, _ = fire_times.count_between(s, at, after["slot"] - _US, limit=missed + 1)
    return count <= missed


def _pause_text(state: Row) -> str:
    changes = state["changes"] or {}
    reason = changes.get("reason")
    until = changes.get("until")
    return (
        f"paused by {state['actor']} at {times.local(state['at'], 'UTC')}"
        + (f" ({reason})" if reason else "")
        + (f" until {until}" if until else "")
    )


def _future(f: Facts, s: spec.Spec, at: datetime) -> tuple[str, str, Row | None]:
    row = f.schedule
    if row.enabled:
        return "scheduled", f"it will fire at {_local(s, at)}", None
    state = _state(f.changes)
    until = row.paused_until
    if until is not None and until <= at:
        words = f"paused until {_at(row, until)}, so it will fire at this slot"
        return "scheduled", words, None
    reason = f" ({row.pause_reason})" if row.pause_reason else ""
    pause = state if _paused_by(state) else None
    return "paused", f"it is paused{reason}: it will not fire then unless resumed before", pause


def _past(f: Facts, s: spec.Spec, at: datetime) -> tuple[str, str, Row | None]:
    state = _state(f.changes)
    after = next((r for r in f.runs if r["position"] == "after"), None)
    coalesced = _covered_by(s, at, after)
    if _paused_by(state):
        assert state is not None
        text = f"no run: the schedule was {_pause_text(state)}"
        if coalesced and after is not None:
            text += f"; on resume the misfire policy folded this slot into run {after['id']}"
        return "paused", text, state
    if coalesced and after is not None:
        return (
            "coalesced",
            f"the slot was found late; the misfire policy ({f.schedule.misfire_policy}) "
            f"folded it into run {after['id']} at {_at(f.schedule, after['slot'])}, which "
            f"stands for {after['missed_slots']} missed slot(s)",
            None,
        )
    cursor = f.schedule.next_fire_at
    if f.schedule.enabled and cursor is not None and cursor <= at:
        return "due", "the slot is due but no scheduler has enqueued it yet: is one running?", None
    if f.retention is not None and at < f.now - f.retention:
        # Beyond the horizon a missing row proves nothing: its run may have been purged.
        kept = durations.format_duration(f.retention)
        return "purged", f"no record: history older than the retention of {kept} was purged", None
    window = f.schedule.catchup_window
    hint = f" (its catchup window is {window})" if window else ""
    return (
        "missed",
        f"no run was made for this slot: no scheduler reached it in time{hint}, or it was "
        "dropped by the misfire policy",
        None,
    )


def _verdict(f: Facts, s: spec.Spec, at: datetime, fire: bool) -> tuple[str, str, Row | None]:
    at_slot = [r for r in f.runs if r["position"] == "at"]
    if at_slot:
        main = next((r for r in at_slot if r["origin"] == RunOrigin.CADENCE), at_slot[0])
        return _RUN_VERDICTS[main["status"]], _describe_run(main), None
    if at < f.schedule.created_at:
        created = _at(f.schedule, f.schedule.created_at)
        return "before_created", f"the schedule did not exist yet (created {created})", None
    if not fire:
        return "not_a_fire_time", f"{_local(s, at)} is not a fire time of {s.expression}", None
    if at > f.now:
        return _future(f, s, at)
    return _past(f, s, at)


def explain(f: Facts) -> dict[str, Any]:
    at = f.at.astimezone(UTC)
    s = spec_at(f.schedule, f.changes)
    try:
        fire_times.compiled(s)
    except ValidationError:  # an old expression this version no longer reads
        s = spec_at(f.schedule, ())
    fire = fire_times.next_after(s, at - _US) == at
    earlier = fire_times.last_between(s, max(at - LOOKBACK, _FLOOR), at - _US, 1)
    verdict, message, pause = _verdict(f, s, at, fire)
    if f.note:
        message = f"{f.note} {message[:1].upper()}{message[1:]}"
    runs = [r for r in f.runs if r["position"] == "at"]
    if verdict in ("coalesced", "paused"):
        runs += [r for r in f.runs if r["position"] == "after" and r["missed_slots"]]
    return {
        "schedule_id": f.schedule.id,
        "at": at.isoformat(),
        "verdict": verdict,
        "message": message,
        "fire_time": fire,
        "previous_fire_time": earlier[-1].isoformat() if earlier else None,
        "next_fire_time": _iso(fire_times.next_after(s, at)),
        "expression": {"kind": s.kind, "expression": s.expression, "timezone": s.timezone},
        "runs": [views.run(r) for r in runs],
        "pause": views.change(pause) if pause is not None else None,
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
