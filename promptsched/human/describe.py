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
_LONGEST_LIST = 12  # values said one by one ("at minutes 0, 7, 14, ... and 56")
_UNITS = {"w": "week", "d": "day", "h": "hour", "m": "minute", "s": "second"}


def describe(kind: str, expression: str) -> str:
    """The expression in words, or the expression itself when its shape is not a common one."""
    try:
        words = {"cron": _cron, "every": _every, "at": _at, "rrule": _rrule}[kind](expression)
    except Exception:  # a describer must never break a page
        words = None
    return words or as_written(kind, expression)


def as_written(kind: str, expression: str) -> str:
    """The expression as the user wrote it (an RRULE without the default DTSTART we add)."""
    if kind == "rrule":
        return expression.replace(f"{_DEFAULT_DTSTART}\n", "", 1)
    return expression


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


_DEFAULT_DTSTART = "DTSTART:19700101T000000"
_RRULE_DAYS = {code: name for code, name in zip(("SU", "MO", "TU", "WE", "TH", "FR", "SA"),
                                                 _DAYS, strict=True)}  # fmt: skip
_SUB_DAILY = {"SECONDLY": "second", "MINUTELY": "minute", "HOURLY": "hour"}
_PERIOD = {"DAILY": "day", "WEEKLY": "week", "MONTHLY": "month", "YEARLY": "year"}
# The parts a sentence can say exactly; a rule with any other part (BYSETPOS, BYMONTH with a
# daily frequency, COUNT, ...) is shown as written rather than described wrongly.
_RRULE_SAYABLE = {
    "SECONDLY": {"FREQ", "INTERVAL"}, "MINUTELY": {"FREQ", "INTERVAL"},
    "HOURLY": {"FREQ", "INTERVAL"},
    "DAILY": {"FREQ", "INTERVAL", "BYHOUR", "BYMINUTE", "BYSECOND"},
    "WEEKLY": {"FREQ", "INTERVAL", "BYDAY", "BYHOUR", "BYMINUTE", "BYSECOND"},
    "MONTHLY": {"FREQ", "INTERVAL", "BYMONTHDAY", "BYHOUR", "BYMINUTE", "BYSECOND"},
    "YEARLY": {"FREQ", "INTERVAL", "BYMONTH", "BYMONTHDAY", "BYHOUR", "BYMINUTE", "BYSECOND"},
}  # fmt: skip


def _rrule_parts(expression: str) -> tuple[datetime, dict[str, str]]:
    """The rule's DTSTART (1970-01-01 when absent) and its NAME=VALUE parts."""
    start = datetime(1970, 1, 1)
    rule = ""
    for line in expression.upper().splitlines():
        head, colon, value = line.strip().partition(":")
        if head == "DTSTART":
            start = datetime.strptime(value.strip()[:15], "%Y%m%dT%H%M%S")
        elif head == "RRULE":
            rule = value
        elif not colon:
            rule = head
    return start, dict(p.split("=", 1) for p in rule.strip().split(";") if "=" in p)


def _rrule(expression: str) -> str | None:
    """A sentence only for the shapes it can say exactly (one time of day, plain weekdays, one
    day of the month); None otherwise, so the page shows the rule itself."""
    start, parts = _rrule_parts(expression)
    freq = parts.get("FREQ", "")
    if freq not in _RRULE_SAYABLE or not set(parts) <= _RRULE_SAYABLE[freq]:
        return None
    interval = int(parts.get("INTERVAL", "1"))
    if freq in _SUB_DAILY:
        return _plural(interval, _SUB_DAILY[freq])
    clock = [
        _single(parts, key, default)
        for key, default in (
            ("BYHOUR", start.hour),
            ("BYMINUTE", start.minute),
            ("BYSECOND", start.second),
        )
    ]
    if any(v is None for v in clock):
        return None
    hour, minute, second = (str(v) for v in clock)
    at = f"at {_hhmm(hour, minute, second)}"
    every = _plural(interval, _PERIOD[freq])
    if freq == "DAILY":
        return f"{every} {at}"
    if freq == "WEEKLY":
        codes = parts.get("BYDAY", list(_RRULE_DAYS)[(start.weekday() + 1) % 7]).split(",")
        if any(code not in _RRULE_DAYS for code in codes):  # an ordinal like 1MO
            return None
        return f"{every} on {_and([_RRULE_DAYS[c] for c in codes])} {at}"
    day = _single(parts, "BYMONTHDAY", start.day)
    if day is None or day < 1:
        return None
    if freq == "MONTHLY":
        return f"{every} on day {day} {at}" if day <= 28 else None  # short months skip it
    month = _single(parts, "BYMONTH", start.month)
    if month is None or not 1 <= month <= 12 or day > calendar.monthrange(2001, month)[1]:
        return None  # 29 February is not "every year"
    return f"{every} on {day} {calendar.month_name[month]} {at}"


def _single(parts: dict[str, str], key: str, default: int) -> int | None:
    """The one value of a BY part (its default when absent); None for a list."""
    value = parts.get(key)
    if value is None:
        return default
    return int(value) if value.isdigit() else None


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
    hours = None if _even_step(hour, 24) else _listed(hour, 24)
    if numbers[0] and numbers[1] and hours is not None and second == "0":
        return "at " + _and([_hhmm(h, minute, second) for h in hours]), True
    return _frequent(second, minute, hour)


def _frequent(second: str, minute: str, hour: str) -> tuple[str, bool] | None:
    if hour == "*" and minute == "*":
        return _seconds(second)
    if second != "0":
        return None
    hour_step = _even_step(hour, 24)
    hours = _hour_range(hour)
    if hours is not None:
        if _even_step(minute, 60):
            return _plural(int(minute.split("/")[1]), "minute") + hours, False
        minutes = _listed(minute, 60)
        if minutes is not None:
            return f"at minutes {_and(minutes)} past each hour{hours}", False
        if minute == "*":
            return "every minute" + hours, False
    if _NUMBER.match(minute):
        at = "on the hour" if minute == "0" else f"at minute {int(minute)}"
        if hour == "*":
            return f"every hour, {at}", False
        if hour_step:
            return f"{_plural(int(hour.split('/')[1]), 'hour')}, {at}", False
        if hours:
            return f"every hour{hours}, {at}", False
    return None


def _seconds(second: str) -> tuple[str, bool] | None:
    """Every minute and hour: the seconds field says it all."""
    if second == "*":
        return "every second", False
    if _even_step(second, 60):
        return _plural(int(second.split("/")[1]), "second"), False
    if second == "0":
        return "every minute", False
    if _NUMBER.match(second):
        return f"at second {int(second)} past each minute", False
    seconds = _listed(second, 60)
    if seconds is not None:
        return f"at seconds {_and(seconds)} past each minute", False
    return None


def _even_step(text: str, size: int) -> bool:
    """`*/n` (or `0/n`) with n dividing the field's size, so the gap is n across its wrap too:
    `*/15` minutes is every 15 minutes; `*/25` is not (:50 to :00 is 10 minutes)."""
    step = _STEP.match(text)
    return step is not None and size % int(step.group(1)) == 0


def _listed(text: str, size: int) -> list[str] | None:
    """The values of a short list, or of a step that does not divide the field's size (`*/25`
    minutes: 0, 25 and 50) as numbers; None for anything else."""
    step = _STEP.match(text)
    if step is not None:
        values = list(range(0, size, int(step.group(1))))
        return [str(v) for v in values] if 1 < len(values) <= _LONGEST_LIST else None
    return _numbers(text) if _is_list(text) else None


def _hour_range(hour: str) -> str | None:
    """The hours phrase: empty for every hour, " from 09:00 to 17:59" for a range; None for
    anything else."""
    if hour == "*":
        return ""
    match = _RANGE.match(hour)
    if match is None:
        return None
    return f" from {int(match.group(1)):02d}:00 to {int(match.group(2)):02d}:59"


def _numbers(text: str) -> list[str]:
    return [str(int(item)) for item in text.split(",")]


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
        if any(not low <= v <= high for v in values) or (high == 7 and values == [0, 7]):
            return None  # `0-7` is every day, not "Sunday through Sunday"
        words.append(" through ".join(label(v) for v in values))
    return _and(words)


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
