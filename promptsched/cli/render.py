"""Human output of the CLI, from the API's JSON: instants in the schedule's zone with a relative
time ("in 3 min", "5 min ago") against an injected ``now``, and values in words (never a
Python repr). ``--json`` output does not pass through here."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from promptsched import budgets
from promptsched.domain import ChangeAction
from promptsched.errors import ValidationError
from promptsched.ops import notify_targets
from promptsched.schedule import fire_times, spec

_US = timedelta(microseconds=1)


def relative(delta: timedelta) -> str:
    """``delta`` = then - now, in words: "in 3 min", "5 min ago", "now"."""
    seconds = int(delta.total_seconds())
    future, left = seconds >= 0, abs(seconds)
    if left < 1:
        return "now"
    if left < 60:
        words = f"{left} s"
    elif left < 3600:
        words = f"{left // 60} min"
    elif left < 86400:
        hours, minutes = divmod(left // 60, 60)
        words = f"{hours} h {minutes} min" if minutes else f"{hours} h"
    else:
        days, hours = divmod(left // 3600, 24)
        words = f"{days} d {hours} h" if hours else f"{days} d"
    return f"in {words}" if future else f"{words} ago"


def parse(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def zone_of(name: str | None) -> Any:
    try:
        return spec.load_zone(name or "UTC")
    except ValidationError:
        return UTC


def when(value: str | datetime | None, zone: str | None, now: datetime) -> str:
    """An instant in ``zone`` with its distance from ``now``; "-" for none."""
    instant = parse(value) if isinstance(value, str) or value is None else value
    if instant is None:
        return "-"
    local = instant.astimezone(zone_of(zone))
    shape = "%Y-%m-%d %H:%M:%S %Z" if local.second or local.microsecond else "%Y-%m-%d %H:%M %Z"
    return f"{local.strftime(shape)} ({relative(instant - now)})"


def _spec(data: Mapping[str, Any]) -> spec.Spec:
    return spec.Spec(
        data["kind"],
        data["expression"],
        data["timezone"],
        data.get("dst_gap") or "shift",
        data.get("dst_fold") or "first",
    )


def next_fire(data: Mapping[str, Any], now: datetime) -> datetime | None:
    """The first fire time after ``now`` of an enabled schedule; None when paused or done.
    The cursor may be behind ``now`` (slots missed while paused, or not yet ticked): those
    are not next, the misfire policy decides them."""
    if not data.get("enabled"):
        return None
    times = [parse(t) for t in data.get("next_fire_times") or []]
    cursor = parse(data.get("next_fire_at"))
    future = [t for t in [cursor, *times] if t is not None and t > now]
    if future:
        return min(future)
    if cursor is None:
        return None
    try:
        found = fire_times.preview(_spec(data), now, 1)
    except ValidationError:
        return None
    return found[0] if found else None


def state(data: Mapping[str, Any], now: datetime) -> str:
    if data.get("enabled"):
        return "enabled"
    until = data.get("paused_until")
    if until:
        return f"paused until {when(until, data.get('timezone'), now)}"
    return "paused"


def next_words(data: Mapping[str, Any], now: datetime) -> str:
    """What comes next, in words: a time, or why there is none."""
    if not data.get("enabled"):
        return "none while paused"
    found = next_fire(data, now)
    return when(found, data.get("timezone"), now) if found else "none (no more fire times)"


def missed_words(data: Mapping[str, Any], now: datetime) -> str | None:
    """A note when the cursor is behind ``now``: slots owed since then meet the misfire policy."""
    cursor = parse(data.get("next_fire_at"))
    if not data.get("enabled") or cursor is None or cursor > now:
        return None
    return (
        f"slots due since {when(cursor, data.get('timezone'), now)} meet the misfire "
        f"policy ({data.get('misfire')}) at the scheduler's next tick"
    )


def scalar(value: Any) -> str:
    """A value in words: no Python reprs."""
    if value is None or value == "" or value == [] or value == {}:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={scalar(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(scalar(v) for v in value)
    if isinstance(value, str):
        return value
    return json.dumps(value)


def notify_words(notify: Mapping[str, Any] | None, *, secret_from: str | None = None) -> str:
    """The targets in words (``notify_targets.words``, shared with the console)."""
    return notify_targets.words(notify, secret_from=secret_from)


def schedule_line(data: Mapping[str, Any], now: datetime) -> str:
    reason = data.get("pause_reason")
    shown = state(data, now) + (f" ({reason})" if reason and not data.get("enabled") else "")
    line = (
        f"schedule {data['id']} {data['name']!r}: {data['kind']} {data['expression']} "
        f"({data['timezone']}), {shown}, next fire: {next_words(data, now)}"
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


def schedule_details(data: Mapping[str, Any], now: datetime) -> str:
    zone = data.get("timezone")
    pairs = [(title, scalar(data.get(key))) for title, key in SCHEDULE_FIELDS if key in data]
    pairs.append(("notify", notify_words(data.get("notify"))))
    if "notify_when" in data:
        pairs.append(("notify when", str(data.get("notify_when") or "always")))
        pairs.append(("output schema", schema_words(data.get("output_schema"))))
    reason = data.get("pause_reason")
    pairs.append(("state", state(data, now) + (f" ({reason})" if reason else "")))
    if data.get("enabled"):
        found = next_fire(data, now)
        upcoming = [parse(t) for t in data.get("next_fire_times") or []]
        shown = [t for t in upcoming if t is not None and found is not None and t >= found]
        if found is not None and not shown:
            shown = [found]
        pairs.append(("next fire times", when(shown[0], zone, now) if shown else "none"))
        pairs.extend(("", when(t, zone, now)) for t in shown[1:])
        missed = missed_words(data, now)
        if missed:
            pairs.append(("", missed))
    else:
        pairs.append(("next fire times", "none while paused"))
    spend = data.get("spend")
    if isinstance(spend, Mapping):
        for period, label in (("day", "spend today"), ("month", "spend this month")):
            got = spend.get(period) or {}
            pairs.append(
                (label, f"{got.get('tokens', 0)} tokens, cost {got.get('cost', 0):g} (UTC)")
            )
        pairs.append(("budget", budgets.describe(data.get("budget"))))
        pairs.extend(("", budgets.standing_words(row)) for row in spend.get("budget") or [])
    pairs.append(("created", when(data.get("created_at"), zone, now)))
    pairs.append(("updated", when(data.get("updated_at"), zone, now)))
    return lines(pairs)


def run_details(data: Mapping[str, Any], zone: str | None, now: datetime) -> str:
    times = ("slot", "available_at", "created_at", "started_at", "finished_at",
             "lease_expires_at", "deadline_at")  # fmt: skip
    skip = ("output", "attempt_history", "notifications")
    pairs = []
    for key, value in data.items():
        if key in skip:
            continue
        shown = when(value, zone, now) if key in times and value else scalar(value)
        pairs.append((key.replace("_", " "), shown))
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
