"""Cron expressions: parsing 5- and 6-field text and matching it against local wall-clock time."""

from __future__ import annotations

import calendar
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from promptsched.errors import ValidationError
from promptsched.schedule import limits

# We parse cron ourselves instead of using croniter: croniter reads a 6th field as SECONDS LAST
# and applies DST rules we do not want. Here a 6-field expression has seconds FIRST, as Quartz,
# Spring and cron-parser read it: `sec min hour dom month dow`.
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {n.lower(): i for i, n in enumerate(calendar.month_abbr) if n}
_WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
# (name used in messages, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _WEEKDAYS),
)
_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
SEARCH_YEARS = 60  # any satisfiable expression fires within this many years (Feb 29 + weekday)


@dataclass(frozen=True, slots=True)
class Cron:
    """A compiled cron expression; every value set is a sorted tuple."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    monthdays: tuple[int, ...]  # 1..31
    last_day: bool  # `L` in the day-of-month field
    weekdays: tuple[int, ...]  # Python numbering, Monday = 0
    nth_weekdays: tuple[tuple[int, int], ...]  # (weekday, n); n = -1 means the last one (`5L`)
    day_or: bool  # both day fields restricted: a day matches either (Vixie cron)
    hour_star: bool  # hour field is literally `*`: the schedule follows real time across DST
    _days_cache: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    @property
    def per_day(self) -> int:
        return len(self.seconds) * len(self.minutes) * len(self.hours)

    def month_days(self, year: int, month: int) -> tuple[int, ...]:
        """The days of this month the day fields match (ignores the month field)."""
        key = (year, month)
        cached = self._days_cache.get(key)
        if cached is None:
            if len(self._days_cache) > 2048:
                self._days_cache.clear()
            cached = self._days_cache[key] = self._compute_days(year, month)
        return cached

    def _compute_days(self, year: int, month: int) -> tuple[int, ...]:
        first_weekday, ndays = calendar.monthrange(year, month)
        by_dom = {d for d in self.monthdays if d <= ndays}
        if self.last_day:
            by_dom.add(ndays)
        by_dow = {d for d in range(1, ndays + 1) if (first_weekday + d - 1) % 7 in self.weekdays}
        for weekday, nth in self.nth_weekdays:
            first = 1 + (weekday - first_weekday) % 7
            day = first + 7 * (nth - 1) if nth > 0 else first + 7 * ((ndays - first) // 7)
            if day <= ndays:
                by_dow.add(day)
        return tuple(sorted(by_dom | by_dow if self.day_or else by_dom & by_dow))

    def time_at_or_after(self, hour: int, minute: int, second: int) -> tuple[int, int, int] | None:
        """The first matching time of day at or after hour:minute:second, if any."""
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_left(hours, hour)
        if i == len(hours):
            return None
        if hours[i] == hour:
            j = bisect_left(minutes, minute)
            if j < len(minutes) and minutes[j] == minute:
                k = bisect_left(seconds, second)
                if k < len(seconds):
                    return hour, minute, seconds[k]
                j += 1
            if j < len(minutes):
                return hour, minutes[j], seconds[0]
            i += 1
            if i == len(hours):
                return None
        return hours[i], minutes[0], seconds[0]

    def next_local(self, after: datetime) -> datetime | None:
        """The first matching naive local time strictly after `after` (whole seconds)."""
        year, month, day = after.year, after.month, after.day
        hms = (after.hour, after.minute, after.second + 1)
        last_year = min(year + SEARCH_YEARS, limits.LAST_YEAR)
        while year <= last_year:
            if month in self.months:
                days = self.month_days(year, month)
                for i in range(bisect_left(days, day), len(days)):
                    if days[i] != day:
                        hms = (0, 0, 0)
                    found = self.time_at_or_after(*hms)
                    if found is not None:
                        return datetime(year, month, days[i], *found)
            i = bisect_right(self.months, month)
            if i < len(self.months):
                month = self.months[i]
            else:
                year, month = year + 1, self.months[0]
            day, hms = 1, (0, 0, 0)
        return None

    def count_times(self, low: tuple[int, int, int], high: tuple[int, int, int]) -> int:
        """How many matching times of day lie in [low, high] (both hh, mm, ss)."""
        return self._count_le(high) - self._count_le(low, strict=True)

    def _count_le(self, hms: tuple[int, int, int], *, strict: bool = False) -> int:
        hour, minute, second = hms
        n_min, n_sec = len(self.minutes), len(self.seconds)
        sec_count = bisect_left if strict else bisect_right
        total = bisect_left(self.hours, hour) * n_min * n_sec
        if hour in self.hours:
            total += bisect_left(self.minutes, minute) * n_sec
            if minute in self.minutes:
                total += sec_count(self.seconds, second)
        return total

    def count_local(self, low: datetime, high: datetime) -> int:
        """How many matching naive local times lie in [low, high] (whole seconds)."""
        if high < low:
            return 0
        lo_day, hi_day = low.date(), high.date()
        lo_t = (low.hour, low.minute, low.second)
        hi_t = (high.hour, high.minute, high.second)
        if lo_day == hi_day:
            return self.count_times(lo_t, hi_t) if self._day_matches(lo_day) else 0
        total = self.count_times(lo_t, (23, 59, 59)) if self._day_matches(lo_day) else 0
        total += self.count_times((0, 0, 0), hi_t) if self._day_matches(hi_day) else 0
        return total + self._count_days(lo_day + timedelta(days=1), hi_day) * self.per_day

    def _day_matches(self, day: date) -> bool:
        return day.month in self.months and day.day in self.month_days(day.year, day.month)

    def _count_days(self, first: date, end: date) -> int:
        """Matching days d with first <= d < end."""
        total = 0
        year, month = first.year, first.month
        while (year, month) <= (end.year, end.month):
            if month in self.months:
                days = self.month_days(year, month)
                at_first = (year, month) == (first.year, first.month)
                at_end = (year, month) == (end.year, end.month)
                lo = bisect_left(days, first.day) if at_first else 0
                hi = bisect_left(days, end.day) if at_end else len(days)
                total += max(0, hi - lo)
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        return total


def compile_cron(text: str) -> Cron:
    """Parse a cron expression or macro; raises ValidationError("expression", ...)."""
    parts = expand_macro(text).split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        raise ValidationError(
            "expression",
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 "
            f"with seconds first; got {len(parts)} in {text.strip()!r}",
        )
    sec, minute, hour, dom, month, dow = parts
    seconds, minutes, hours = (_values(i, p) for i, p in enumerate(parts[:3]))
    months = _values(4, month)
    monthdays, last_day = _monthdays(dom)
    weekdays, nth = _weekdays(dow)
    dom_star, dow_star = dom[0] in "*?", dow[0] in "*?"
    cron = Cron(
        seconds=seconds,
        minutes=minutes,
        hours=hours,
        months=months,
        monthdays=monthdays,
        last_day=last_day,
        weekdays=weekdays,
        nth_weekdays=nth,
        day_or=not (dom_star or dow_star),
        hour_star=hour == "*",
    )
    if dow_star and not last_day and not _dom_possible(monthdays, months):
        names = ", ".join(calendar.month_name[m] for m in months)
        raise ValidationError(
            "expression",
            f"{text.strip()!r} never fires: day-of-month {dom} does not occur in {names}",
        )
    return cron


def check_steps(text: str) -> None:
    """At save time: refuse a step larger than its field's range (`*/61` minutes would fire
    once an hour while reading as every 61 minutes), as most cron validators do. Stored
    expressions are not checked again, so one saved before this rule keeps firing."""
    parts = expand_macro(text).split()
    if len(parts) == 5:
        parts = ["0", *parts]
    for (name, low, high, _), part in zip(_FIELDS, parts, strict=False):
        for item in part.split(","):
            _, slash, step = item.partition("/")
            if slash and _is_number(step) and int(step) > high - low:
                raise ValidationError(
                    "expression",
                    f"{name} field {part!r}: step {int(step)} is larger than the field's range "
                    f"{low}-{high} allows (at most {high - low})",
                )


def expand_macro(text: str) -> str:
    stripped = text.strip()
    if not stripped.startswith("@"):
        return stripped
    macro = MACROS.get(stripped.lower())
    if macro is None:
        raise ValidationError(
            "expression", f"unknown cron macro {stripped!r}; use one of {', '.join(MACROS)}"
        )
    return macro


def _dom_possible(monthdays: tuple[int, ...], months: tuple[int, ...]) -> bool:
    return any(d <= _MAX_DAYS[m - 1] for d in monthdays for m in months)


def _values(index: int, text: str) -> tuple[int, ...]:
    name, low, high, names = _FIELDS[index]
    values: set[int] = set()
    for item in text.split(","):
        values.update(_item(name, low, high, names, item, text))
    return tuple(sorted(values))


def _item(name: str, low: int, high: int, names: dict[str, int], item: str, whole: str) -> range:
    where = f"{name} field {whole!r}"
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _is_number(step_text) or int(step_text) == 0:
            raise ValidationError("expression", f"{where}: step {step_text!r} must be a number > 0")
        step = int(step_text)
    if base in ("*", "?"):
        if base == "?" and name not in ("day-of-month", "day-of-week"):
            raise ValidationError("expression", f"{where}: '?' is only allowed in the day fields")
        return range(low, high + 1, step)
    first_text, dash, last_text = base.partition("-")
    first = _number(first_text, low, high, names, where)
    if dash:
        last = _number(last_text, low, high, names, where)
        if last < first:
            raise ValidationError(
                "expression", f"{where}: range {base!r} runs backwards; split it with a comma"
            )
    else:
        last = high if slash else first
    return range(first, last + 1, step)


def _number(text: str, low: int, high: int, names: dict[str, int], where: str) -> int:
    value = names.get(text.lower()) if names else None
    if value is None:
        if not _is_number(text):
            raise ValidationError("expression", f"{where}: {text!r} is not a number or name")
        value = int(text)
    if not low <= value <= high:
        raise ValidationError("expression", f"{where}: {value} is out of range {low}-{high}")
    return value


def _is_number(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '¹' (which int() rejects) and '٣'."""
    return text.isascii() and text.isdigit()


def _monthdays(text: str) -> tuple[tuple[int, ...], bool]:
    items = text.split(",")
    last_day = "L" in (i.upper() for i in items)
    rest = [i for i in items if i.upper() != "L"]
    if any(i.upper().endswith("W") for i in rest):
        raise ValidationError("expression", f"day-of-month field {text!r}: 'W' is not supported")
    return (_values(3, ",".join(rest)) if rest else ()), last_day


def _weekdays(text: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Cron weekdays (0 or 7 = Sunday) to Python ones (Monday = 0), plus `5#2`/`5L` items."""
    plain: list[str] = []
    nth: list[tuple[int, int]] = []
    where = f"day-of-week field {text!r}"
    for item in text.split(","):
        day_text, hash_, n_text = item.partition("#")
        if hash_ or (item.upper().endswith("L") and len(item) > 1):
            if not hash_:
                day_text, n_text = item[:-1], "-1"
            elif not _is_number(n_text) or not 1 <= int(n_text) <= 5:
                raise ValidationError("expression", f"{where}: '#{n_text}' must be #1 to #5")
            day = _number(day_text, 0, 7, _WEEKDAYS, where)
            nth.append(((day - 1) % 7, int(n_text)))
        else:
            plain.append(item)
    cron_days = _values(5, ",".join(plain)) if plain else ()
    return tuple(sorted({(d - 1) % 7 for d in cron_days})), tuple(sorted(set(nth)))
