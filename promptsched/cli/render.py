"""Human output of the CLI, from the API's JSON: instants in the schedule's zone with a relative
time ("in 3 min", "5 min ago") against an injected ``now``, and values in words (never a
Python repr). ``--json`` output does not pass through here."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from promptsched import budgets
from promptsched.domain import ChangeAction
from promptsched.errors import ValidationError
from promptsched.human import describe, text, times
from promptsched.human import runs as human_runs
from promptsched.human import schedules as human_schedules
from promptsched.ops import notify_targets
from promptsched.schedule import fire_times, spec

_US = timedelta(microseconds=1)


def _spec(data: Mapping[str, Any]) -> spec.Spec:
    return spec.Spec(
        data["kind"],
        data["expression"],
        data["timezone"],
        data.get("dst_gap") or "shift",
        data.get("dst_fold") or "first",
    )


def _first_from(data: Mapping[str, Any], start: datetime) -> datetime | None:
    """The first fire time at or after ``start``, by the scheduler's own code path."""
    try:
        found = fire_times.preview(_spec(data), start - _US, 1)
    except ValidationError:
        return None
    return found[0] if found else None


def next_fire(data: Mapping[str, Any], now: datetime) -> datetime | None:
    """The first fire time after ``now``; None when paused without an end, or done. The
    cursor may be behind ``now`` (slots missed while paused, or not yet ticked): those are
    not next, the misfire policy decides them. A pause with an end skips the slots inside it,
    so the next fire is the first slot once it ends."""
    cursor = times.instant(data.get("next_fire_at"))
    if not data.get("enabled"):
        until = times.instant(data.get("paused_until"))
        return _first_from(data, max(until, now)) if until and cursor else None
    upcoming = [times.instant(t) for t in data.get("next_fire_times") or []]
    future = [t for t in [cursor, *upcoming] if t is not None and t > now]
    if future:
        return min(future)
    return _first_from(data, now) if cursor is not None else None


def state(data: Mapping[str, Any], now: datetime) -> str:
    """``enabled``, ``done (fired once)``, ``paused until ... (in 3 min) (reason)``."""
    return human_schedules.state_words(
        enabled=bool(data.get("enabled")),
        cursor=times.instant(data.get("next_fire_at")),
        kind=str(data.get("kind")),
        paused_until=times.instant(data.get("paused_until")),
        reason=data.get("pause_reason"),
        zone=data.get("timezone"),
        now=now,
    )


def next_words(data: Mapping[str, Any], now: datetime) -> str:
    """What comes next, in words: a time, or why there is none."""
    found = next_fire(data, now)
    if not data.get("enabled"):
        if found is None:
            return "none while paused"
        return f"{times.when(found, data.get('timezone'), now)}, the first slot after the pause"
    if found is None:
        return "none (no more fire times)"
    return times.when(found, data.get("timezone"), now)


def missed_words(data: Mapping[str, Any], now: datetime) -> str | None:
    """A note when the cursor is behind ``now``: slots owed since then meet the misfire policy."""
    cursor = times.instant(data.get("next_fire_at"))
    if not data.get("enabled") or cursor is None or cursor > now:
        return None
    return (
        f"slots due since {times.when(cursor, data.get('timezone'), now)} meet the misfire "
        f"policy ({data.get('misfire')}) at the scheduler's next tick"
    )


def scalar(value: Any) -> str:
    """A value in words: no Python reprs."""
    return text.words(value)


def notify_words(notify: Mapping[str, Any] | None, *, secret_from: str | None = None) -> str:
    """The targets in words (``notify_targets.words``, shared with the console)."""
    return notify_targets.words(notify, secret_from=secret_from)


def schedule_line(data: Mapping[str, Any], now: datetime) -> str:
    line = (
        f"schedule {data['id']} {data['name']!r}: {data['kind']} {data['expression']} "
        f"({data['timezone']}), {state(data, now)}, next fire: {next_words(data, now)}"
    )
    missed = missed_words(data, now)
    return f"{line}\n  {missed}" if missed else line


SCHEDULE_FIELDS = (
    ("id", "id"), ("owner", "owner"), ("name", "name"), ("kind", "kind"),
    ("expression", "expression"), ("timezone", "timezone"), ("prompt", "prompt"),
    ("provider", "provider"), ("model", "model"), ("params", "params"),
    ("misfire", "misfire"), ("misfire cap", "misfire_cap"), ("misfire grace", "misfire_grace"),
    ("catch-up window", "catchup_window"), ("overlap", "overlap"),
    ("max attempts", "max_attempts"), ("timeout", "timeout"), ("jitter", "jitter"),
    ("give up after", "give_up_after"), ("fallback", "fallback"),
    ("dst gap", "dst_gap"), ("dst fold", "dst_fold"),
    ("pause after failures", "pause_after_failures"), ("version", "version"),
)  # fmt: skip


def lines(pairs: Sequence[tuple[str, str]]) -> str:
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in pairs)


def schema_words(schema: Any) -> str:
    """An output schema in a few words: its title and top-level properties."""
    if not isinstance(schema, Mapping):
        return "none (free text)"
    props = schema.get("properties")
    names = ", ".join(props) if isinstance(props, Mapping) else ""
    title = schema.get("title")
    head = f"{title}: " if isinstance(title, str) and title else ""
    return f"{head}a JSON object" + (f" with {names}" if names else "")


def _fire_pairs(data: Mapping[str, Any], now: datetime) -> list[tuple[str, str]]:
    """The next fire times (from the first after now), or why there are none."""
    zone = data.get("timezone")
    found = next_fire(data, now)
    if found is None or not data.get("enabled"):
        return [("next fire times", next_words(data, now))]
    upcoming = [times.instant(t) for t in data.get("next_fire_times") or []]
    shown = [t for t in upcoming if t is not None and t >= found] or [found]
    pairs = [("next fire times" if i == 0 else "", times.when(t, zone, now))
             for i, t in enumerate(shown)]  # fmt: skip
    missed = missed_words(data, now)
    return pairs + ([("", missed)] if missed else [])


def _spend_pairs(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    spend = data.get("spend")
    if not isinstance(spend, Mapping):
        return []
    pairs = []
    for period, label in (("day", "spend today"), ("month", "spend this month")):
        got = spend.get(period) or {}
        pairs.append((label, f"{budgets.amount('tokens', got.get('tokens', 0))}, cost "
                             f"{budgets.amount('cost', got.get('cost', 0))} (UTC)"))  # fmt: skip
    pairs.append(("budget", budgets.describe(data.get("budget"))))
    pairs.extend(("", budgets.standing_words(row)) for row in spend.get("budget") or [])
    return pairs


def schedule_details(data: Mapping[str, Any], now: datetime) -> str:
    zone = data.get("timezone")
    pairs = [(title, scalar(data.get(key))) for title, key in SCHEDULE_FIELDS if key in data]
    pairs.insert(5, ("in words", describe.describe(str(data.get("kind")),
                                                  str(data.get("expression")))))  # fmt: skip
    pairs.append(("notify", notify_words(data.get("notify"))))
    if "notify_when" in data:
        pairs.append(("notify when", str(data.get("notify_when") or "always")))
        pairs.append(("output schema", schema_words(data.get("output_schema"))))
    pairs.append(("state", state(data, now)))
    pairs.extend(_fire_pairs(data, now))
    pairs.extend(_spend_pairs(data))
    pairs.append(("created", times.when(data.get("created_at"), zone, now)))
    pairs.append(("updated", times.when(data.get("updated_at"), zone, now)))
    return lines(pairs)


def notify_decision_words(run: Mapping[str, Any]) -> str | None:
    """A monitor's decision in words: ``notified: output changed since run 41`` or ``not
    notified: output unchanged since run 41``; None for a run without one."""
    decision = run.get("notify_decision")
    if not isinstance(decision, Mapping):
        return None
    verdict = "notified" if decision.get("notify") else "not notified"
    return f"{verdict}: {decision.get('reason')}"


_RUN_TIMES = ("slot", "available_at", "created_at", "started_at", "finished_at",
              "lease_expires_at", "deadline_at")  # fmt: skip
# A finished run holds no lease and has no deadline ahead: those rows would only mislead.
_UNFINISHED_ONLY = ("lease_expires_at", "deadline_at")
_RUN_HIDDEN = ("output", "attempt_history", "notifications", "schedule_id", "output_json")
FINISHED = ("succeeded", "dead", "cancelled", "skipped")


def run_details(
    data: Mapping[str, Any], zone: str | None, now: datetime, schedule: str | None = None
) -> str:
    """A run's facts, times in ``zone``; ``schedule`` is its schedule's name in words."""
    finished = data.get("status") in FINISHED
    pairs = []
    for key, value in data.items():
        if key in _RUN_HIDDEN or (finished and key in _UNFINISHED_ONLY):
            continue
        if key == "notify_decision":
            pairs.append(("notify", notify_decision_words(data) or "on every success"))
            continue
        if key == "cleaned_chars":
            if value:
                pairs.append(("cleaned", human_runs.cleaned_words(value)))
            continue
        shown = times.when(value, zone, now) if key in _RUN_TIMES and value else scalar(value)
        pairs.append((key.replace("_", " "), shown))
    pairs.insert(1, ("schedule", schedule or f"#{data.get('schedule_id')}"))
    return lines(pairs)


def change_words(change: Mapping[str, Any]) -> str:
    """What one history entry changed, in words."""
    changes = change.get("changes") or {}
    if change.get("action") == ChangeAction.UPDATE and isinstance(changes, Mapping):
        parts = []
        for key, value in changes.items():
            if isinstance(value, list) and len(value) == 2:
                parts.append(f"{key}: {scalar(value[0])} -> {scalar(value[1])}")
            else:
                parts.append(f"{key}: {scalar(value)}")
        return "; ".join(parts)
    if change.get("action") == ChangeAction.CREATE:
        fields = changes.get("fields") if isinstance(changes, Mapping) else None
        if isinstance(fields, Mapping):
            return f"{fields.get('kind')} {fields.get('expression')} ({fields.get('timezone')})"
    if isinstance(changes, Mapping):
        return ", ".join(f"{k}={scalar(v)}" for k, v in changes.items() if v is not None)
    return scalar(changes)


def warn(data: Mapping[str, Any]) -> None:
    """Each of an answer's ``warnings`` (what will not work as asked) on stderr, whatever the
    output format: stdout carries the answer."""
    for warning in data.get("warnings") or ():
        print(f"promptsched: warning: {warning}", file=sys.stderr)
