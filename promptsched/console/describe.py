"""Schedule expressions in words ("every day at 09:00", "every 15 minutes") for the common
shapes; anything else falls back to the expression as written. Never raises."""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable
from datetime import datetime

from promptsched.durations import parse_duration

_NUMBER = re.compile(r"^\d{1,2}$")
_STEP = re.compile(r"^(?:\*|0)/(\d{1,2})$")
_RANGE = re.compile(r"^(\d{1,2})-(\d{1,2})$")
_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_DAY_NAMES = {name[:3].lower(): i for i, name in enumerate(_DAYS)}
_MONTH_NAMES = {calendar.month_abbr[i].lower(): i for i in range(1, 13)}
_MACROS = {
    "@yearly": "every year on 1 January at 00:00",
    "@annually": "every year on 1 January at 00:00",
    "@monthly": "on day 1 of every month at 00:00",
    "@weekly": "every Sunday at 00:00",
    "@daily": "every day at 00:00",
    "@midnight": "every day at 00:00",
    "@hourly": "every hour, on the hour",
}
_UNITS = {"w": "week", "d": "day", "h": "hour", "m": "minute", "s": "second"}


def describe(kind: str, expression: str) -> str:
    """The expression in words, or the expression itself when its shape is not a common one."""
    try:
        words = {"cron": _cron, "every": _every, "at": _at, "rrule": _rrule}[kind](expression)
    except Exception:  # a describer must never break a page
        words = None
    return words or expression


def _plural(count: int, unit: str) -> str:
    return f"every {unit}" if count == 1 else f"every {count} {unit}s"


def _every(expression: str) -> str | None:
    period, _, anchor = expression.partition(" from ")
    match = re.fullmatch(r"(\d+)(w|d|h|m|s)", period.strip())
    if match is None:
        seconds = int(parse_duration(period, field="expression").total_seconds())
        text = _plural(seconds, "second")
    else:
        text = _plural(int(match.group(1)), _UNITS[match.group(2)])
    return f"{text} from {anchor.strip()}" if anchor else text


def _at(expression: str) -> str:
    value = datetime.fromisoformat(expression.replace("Z", "+00:00"))
    return f"once, on {value.strftime('%a %d %b %Y at %H:%M')}"


def _rrule(expression: str) -> str | None:
    rule = expression.upper().rsplit("RRULE:", 1)[-1]
    parts = dict(p.split("=", 1) for p in rule.strip().split(";") if "=" in p)
    freq = {"YEARLY": "yearly", "MONTHLY": "monthly", "WEEKLY": "weekly", "DAILY": "daily",
            "HOURLY": "hourly", "MINUTELY": "every minute", "SECONDLY": "every second"}  # fmt: skip
    word = freq.get(parts.get("FREQ", ""))
    if word is None:
        return None
    interval = parts.get("INTERVAL", "1")
    if interval != "1":
        word = f"{word} (every {interval} periods)"
    return f"{word} (RRULE)"


def _cron(expression: str) -> str | None:
    text = " ".join(expression.split())
    if text.startswith("@"):
        return _MACROS.get(text.lower())
    fields = text.split(" ")
    if len(fields) == 5:
        fields = ["0", *fields]
    if len(fields) != 6:
        return None
    second, minute, hour, dom, month, dow = fields
    when = _time(second, minute, hour)
    days = _days(dom, month, dow)
    if when is None or days is None:
        return None
    phrase, clock = when
    if clock:  # a time of day: "every day at 09:00", "at 09:00 on Monday through Friday"
        return f"every day {phrase}" if days == "" else f"{phrase} {days}"
    return phrase if days == "" else f"{phrase}, {days}"


def _hhmm(hour: str, minute: str, second: str) -> str:
    text = f"{int(hour):02d}:{int(minute):02d}"
    return text if second == "0" else f"{text}:{int(second):02d}"


def _time(second: str, minute: str, hour: str) -> tuple[str, bool] | None:
    """The time-of-day phrase, and whether it names clock times ("at 09:00")."""
    numbers = [_NUMBER.match(f) is not None for f in (second, minute, hour)]
    if all(numbers):
        return f"at {_hhmm(hour, minute, second)}", True
    if numbers[0] and numbers[1] and _is_list(hour) and second == "0":
        hours = hour.split(",")
        return "at " + _and([_hhmm(h, minute, second) for h in hours]), True
    return _frequent(second, minute, hour)


def _frequent(second: str, minute: str, hour: str) -> tuple[str, bool] | None:
    sec_step, min_step, hour_step = (_STEP.match(f) for f in (second, minute, hour))
    if hour == "*" and minute == "*":
        if second == "*":
            return "every second", False
        if sec_step:
            return _plural(int(sec_step.group(1)), "second"), False
        if second == "0":
            return "every minute", False
        if _NUMBER.match(second):
            return f"at second {int(second)} of every minute", False
    if second != "0":
        return None
    hours = _hour_range(hour)
    if min_step and hours is not None:
        return _plural(int(min_step.group(1)), "minute") + hours, False
    if minute == "*" and hours is not None:
        return "every minute" + hours, False
    if _NUMBER.match(minute):
        at = "on the hour" if minute == "0" else f"at minute {int(minute)}"
        if hour == "*":
            return f"every hour, {at}", False
        if hour_step:
            return f"{_plural(int(hour_step.group(1)), 'hour')}, {at}", False
        if hours:
            return f"every hour{hours}, {at}", False
    return None


def _hour_range(hour: str) -> str | None:
    """The hours phrase: empty for every hour, " from 09:00 to 17:59" for a range; None for
    anything else."""
    if hour == "*":
        return ""
    match = _RANGE.match(hour)
    if match is None:
        return None
    return f" from {int(match.group(1)):02d}:00 to {int(match.group(2)):02d}:59"


def _is_list(text: str) -> bool:
    items = text.split(",")
    return 1 < len(items) <= 6 and all(_NUMBER.match(i) for i in items)


def _days(dom: str, month: str, dow: str) -> str | None:
    """The day phrase ("" = every day), or None for a shape it does not describe."""
    dom_star, dow_star = dom in ("*", "?"), dow in ("*", "?")
    if not dom_star and not dow_star:
        return None
    parts = []
    if not dow_star:
        days = _weekdays(dow)
        if days is None:
            return None
        parts.append(days)
    if not dom_star:
        if dom == "L":
            parts.append("on the last day of the month")
        elif _NUMBER.match(dom):
            parts.append(f"on day {int(dom)} of the month")
        else:
            return None
    if month != "*":
        months = _names(month, _MONTH_NAMES, lambda i: calendar.month_name[i], low=1, high=12)
        if months is None:
            return None
        parts.append(f"in {months}")
    return " ".join(parts)


def _weekdays(dow: str) -> str | None:
    if dow.lower() in ("1-5", "mon-fri"):
        return "on weekdays (Monday to Friday)"
    if dow.lower() in ("0,6", "6,0", "sat,sun", "sun,sat"):
        return "on weekends"
    names = _names(dow, _DAY_NAMES, lambda i: _DAYS[i % 7], low=0, high=7)
    return None if names is None else f"on {names}"


def _names(
    field: str, names: dict[str, int], label: Callable[[int], str], *, low: int, high: int
) -> str | None:
    """A list of single values and ranges as words ("Monday through Friday", "January and
    July"); None for steps or anything unusual."""
    words = []
    for item in field.lower().split(","):
        ends = item.split("-")
        if len(ends) > 2:
            return None
        values = [names.get(e, int(e) if e.isdigit() else -1) for e in ends]
        if any(not low <= v <= high for v in values):
            return None
        words.append(" through ".join(label(v) for v in values))
    return _and(words)


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
