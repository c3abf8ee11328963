"""RFC 5545 recurrence rules: parsing DTSTART + RRULE and listing their local wall-clock times."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta, tzinfo
from functools import lru_cache
from itertools import islice
from typing import Any

from dateutil import rrule as du

from promptsched.errors import ValidationError
from promptsched.schedule import expand, limits, zone

MAX_COUNT = 100_000
MAX_INTERVAL = 10_000
_NAIVE_EPOCH = datetime(1970, 1, 1)
_DTSTART = re.compile(
    r"DTSTART(?:;VALUE=DATE(?:-TIME)?)?(?:;TZID=(?P<tzid>[^:;]+))?(?:;VALUE=DATE(?:-TIME)?)?"
    r":(?P<value>\d{8}(?:T\d{6}Z?)?)",
    re.IGNORECASE | re.ASCII,
)
_UNTIL = re.compile(r"(?P<date>\d{8})(?:T(?P<time>\d{6})(?P<z>Z)?)?", re.ASCII)
# How much local time one cached window of occurrences spans, by FREQ (YEARLY .. SECONDLY).
_WINDOWS = (
    timedelta(days=3653),
    timedelta(days=366),
    timedelta(days=182),
    timedelta(days=61),
    timedelta(days=4),
    timedelta(days=1),
    timedelta(hours=1),
)
_FREQS = ("YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY")
_WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
_RANGES = {  # BY* part: (low, high, may be negative)
    "BYSECOND": (0, 59, False),
    "BYMINUTE": (0, 59, False),
    "BYHOUR": (0, 23, False),
    "BYMONTH": (1, 12, False),
    "BYMONTHDAY": (1, 31, True),
    "BYYEARDAY": (1, 366, True),
    "BYWEEKNO": (1, 53, True),
    "BYSETPOS": (1, 366, True),
}


@dataclass(frozen=True, slots=True, eq=False)
class RRule:
    """A compiled rule over naive local times; COUNT is turned into an equivalent UNTIL."""

    rule: du.rrule
    dtstart: datetime  # naive local
    freq: int
    interval: int
    wkst: int
    defaults: dict[str, Any]  # BY* values dateutil would derive from DTSTART, made explicit
    until_utc: datetime | None  # exact end for a UTC UNTIL (the naive one in `rule` is padded)
    hour_star: bool  # HOURLY or finer without BYHOUR: follows real time across DST
    step: timedelta | None  # set when occurrences are just DTSTART + k * step (no BY* parts)
    until_local: datetime | None  # naive local bound (UNTIL, or the last COUNTed occurrence)
    _windows: dict[int, tuple[tuple[datetime, ...], datetime | None]] = field(
        default_factory=dict, repr=False
    )

    def next_local(self, after: datetime) -> datetime | None:
        """The first occurrence (naive local) strictly after `after`."""
        occurrences, following = self._window(self._index(after))
        i = bisect_right(occurrences, after)
        return occurrences[i] if i < len(occurrences) else following

    def count_local(self, low: datetime, high: datetime, limit: int) -> int:
        """Occurrences in [low, high]; stops early once the count passes `limit`."""
        if self.step is not None:  # an arithmetic progression: closed form
            high = high if self.until_local is None else min(high, self.until_local)
            first = 0 if low <= self.dtstart else -((self.dtstart - low) // self.step)
            return max(0, (high - self.dtstart) // self.step - first + 1) if high >= low else 0
        total, index = 0, self._index(low)
        while total <= limit:
            occurrences, following = self._window(index)
            total += bisect_right(occurrences, high) - bisect_left(occurrences, low)
            if following is None or following > high:
                break
            index = self._index(following)
        return total

    def _index(self, local: datetime) -> int:
        return (local - _NAIVE_EPOCH) // _WINDOWS[self.freq]

    def _window(self, index: int) -> tuple[tuple[datetime, ...], datetime | None]:
        cached = self._windows.get(index)
        if cached is None:
            if len(self._windows) > 16:  # a MINUTELY window holds 1440 datetimes
                self._windows.clear()
            cached = self._windows[index] = self._compute_window(index)
        return cached

    def _compute_window(self, index: int) -> tuple[tuple[datetime, ...], datetime | None]:
        start = _NAIVE_EPOCH + index * _WINDOWS[self.freq]
        end = start + _WINDOWS[self.freq]
        found: list[datetime] = []
        for occurrence in bounded(self._rule_from(start)):
            if occurrence >= end:
                return tuple(found), occurrence
            if occurrence >= start:
                found.append(occurrence)
        return tuple(found), None

    def _rule_from(self, target: datetime) -> du.rrule:
        """The same rule restarted at a DTSTART at or before `target`, a whole number of
        INTERVALs after the original one, so iteration does not start in the distant past."""
        new = _shifted_start(self, target)
        if new is None or new <= self.dtstart:
            return self.rule
        return self.rule.replace(dtstart=new, **self.defaults)


def _shifted_start(r: RRule, target: datetime) -> datetime | None:
    start, n = r.dtstart, r.interval
    if r.freq == du.YEARLY:
        years = (target.year - 1 - start.year) // n * n
        return datetime(start.year + years, 1, 1)
    if r.freq == du.MONTHLY:
        months = ((target.year - start.year) * 12 + target.month - start.month - 1) // n * n
        total = start.year * 12 + start.month - 1 + months
        return datetime(total // 12, total % 12 + 1, 1)
    if r.freq == du.WEEKLY:
        week = datetime.combine(start.date() - timedelta((start.weekday() - r.wkst) % 7), time())
        return week + timedelta(weeks=((target - week).days // 7 - 1) // n * n)
    if r.freq == du.DAILY:
        day = datetime.combine(start.date(), time())
        return day + timedelta(days=((target - day).days - 1) // n * n)
    unit, base = {
        du.HOURLY: (timedelta(hours=1), start.replace(minute=0, second=0)),
        du.MINUTELY: (timedelta(minutes=1), start.replace(second=0)),
    }.get(r.freq, (timedelta(seconds=1), start))
    return base + ((target - base) // unit - 1) // n * n * unit


def canonical(text: str, where: tzinfo) -> str:
    """The stored form: `DTSTART:...` and `RRULE:...` lines (DTSTART 1970-01-01 if missing)."""
    dtstart_line, body = _split(text)
    compile_rrule(text, where)
    match = _DTSTART.fullmatch(dtstart_line or "DTSTART:19700101T000000")
    assert match is not None  # compile_rrule checked it
    tzid = f";TZID={match['tzid']}" if match["tzid"] else ""
    return f"DTSTART{tzid}:{match['value'].upper()}\nRRULE:{body}"


@lru_cache(maxsize=1024)
def compile_rrule(text: str, where: tzinfo) -> RRule:
    """Parse DTSTART + RRULE; raises ValidationError("expression", ...). Cached: validating
    a schedule and computing its fire times compile it once."""
    dtstart_line, body = _split(text)
    dtstart = _dtstart(dtstart_line, where) if dtstart_line else _NAIVE_EPOCH
    parts = _parts(body)
    if "COUNT" in parts and "UNTIL" in parts:
        raise ValidationError("expression", "an RRULE may have COUNT or UNTIL, not both")
    until_text = parts.pop("UNTIL", None)
    count_text = parts.pop("COUNT", None)
    _check_ranges(parts)
    rule = _dateutil_rule(parts, dtstart)
    _check_possible(parts)
    _check_phase(parts, dtstart)
    _check_setpos(parts)
    freq = _FREQS.index(parts["FREQ"])
    expansion = _as_daily(parts, freq, dtstart)
    if expansion is not None:
        rule = _dateutil_rule(expansion, dtstart)
    until_utc, until_local = _until(until_text, where) if until_text else (None, None)
    if count_text is not None:
        until_local = _last_of(rule, _count(count_text))
    if until_local is not None:
        rule = rule.replace(until=until_local)
    return RRule(
        rule=rule,
        dtstart=dtstart,
        freq=freq,
        interval=int(parts.get("INTERVAL", "1")),
        wkst=_WEEKDAYS.index(parts.get("WKST", "MO")),
        defaults=_defaults(expansion or parts, du.DAILY if expansion else freq, dtstart),
        until_utc=until_utc,
        hour_star=freq >= du.HOURLY and "BYHOUR" not in parts,
        step=_step(parts, freq),
        until_local=until_local,
    )


_ALL = {"BYHOUR": ",".join(map(str, range(24))), "BYMINUTE": ",".join(map(str, range(60)))}
_ALL["BYSECOND"] = _ALL["BYMINUTE"]
_DAILY_TIMES = 3600  # rewrite to DAILY only while one day holds at most this many times


def _as_daily(parts: dict[str, str], freq: int, dtstart: datetime) -> dict[str, str] | None:
    """The same rule at FREQ=DAILY, for a HOURLY/MINUTELY/SECONDLY rule with INTERVAL=1 and
    filters (None when there is nothing to gain).

    With INTERVAL=1 such a rule visits every hour/minute/second, so its occurrences are the
    days its day filters keep times the times its BYHOUR/BYMINUTE/BYSECOND keep (a missing
    finer part is every value, a missing coarser one DTSTART's): exactly a DAILY rule with
    all three explicit. dateutil walks the sub-daily rule second by second between matches
    (a day of seconds per day skipped); the DAILY one takes one step per day.
    """
    filters = set(parts) - {"FREQ", "INTERVAL", "WKST"}
    if freq < du.HOURLY or parts.get("INTERVAL", "1") != "1" or not filters:
        return None
    if "BYSETPOS" in parts:  # at SECONDLY every period holds one time: only 1 / -1 select it
        if freq != du.SECONDLY:
            return None
        filters.discard("BYSETPOS")
    out = {k: v for k, v in parts.items() if k in filters}
    out["FREQ"] = "DAILY"
    for key, unit, value in (
        ("BYHOUR", du.HOURLY, dtstart.hour),
        ("BYMINUTE", du.MINUTELY, dtstart.minute),
        ("BYSECOND", du.SECONDLY, dtstart.second),
    ):
        out.setdefault(key, _ALL[key] if freq >= unit else str(value))
    times = 1
    for key in ("BYHOUR", "BYMINUTE", "BYSECOND"):
        times *= len(set(out[key].split(",")))
    return out if times <= _DAILY_TIMES else None


def _check_setpos(parts: dict[str, str]) -> None:
    """BYSETPOS picks from the occurrences of one period; a position past the most a period
    can hold never matches (dateutil would search every period up to year 9999)."""
    if "BYSETPOS" not in parts:
        return
    sizes = {k: len(set(parts[k].split(","))) if k in parts else 1 for k in _TIME_KEYS}
    freq = _FREQS.index(parts["FREQ"])
    most = 1
    for key, unit in zip(_TIME_KEYS, (du.HOURLY, du.MINUTELY, du.SECONDLY), strict=True):
        most *= sizes[key] if freq < unit else 1
    most *= (366, 31, 7, 1, 1, 1, 1)[freq]
    if all(abs(int(p)) > most for p in parts["BYSETPOS"].split(",")):
        raise ValidationError(
            "expression",
            f"the RRULE never fires: BYSETPOS={parts['BYSETPOS']} but one FREQ={parts['FREQ']} "
            f"period holds at most {most} occurrence(s)",
        )


_TIME_KEYS = ("BYHOUR", "BYMINUTE", "BYSECOND")


def _step(parts: dict[str, str], freq: int) -> timedelta | None:
    """The fixed wall-clock step of a rule without BY* parts (WEEKLY..SECONDLY), else None."""
    if set(parts) - {"FREQ", "INTERVAL", "WKST"} or freq < du.WEEKLY:
        return None
    unit = (timedelta(weeks=1), timedelta(days=1), timedelta(hours=1), timedelta(minutes=1))
    return (unit + (timedelta(seconds=1),))[freq - du.WEEKLY] * int(parts.get("INTERVAL", "1"))


def _split(text: str) -> tuple[str | None, str]:
    dtstart: str | None = None
    body: str | None = None
    for token in text.split():
        upper = token.upper()
        if upper.startswith("DTSTART") and dtstart is None:
            dtstart = token  # TZID keeps its case
        elif upper.startswith(("RRULE:", "FREQ=")) and body is None:
            body = upper.removeprefix("RRULE:")
        else:
            raise ValidationError(
                "expression",
                f"unexpected {token!r}: an rrule is one optional DTSTART line and one RRULE line",
            )
    if body is None:
        raise ValidationError("expression", "an RRULE line (RRULE:FREQ=...) is required")
    return dtstart, body


def _dtstart(line: str, where: tzinfo) -> datetime:
    match = _DTSTART.fullmatch(line)
    if match is None:
        raise ValidationError(
            "expression", f"{line!r} is not a DTSTART like DTSTART:20260101T090000"
        )
    value = match["value"]
    tzid, name = match["tzid"], getattr(where, "key", "UTC")
    if tzid is not None and tzid.lower() != name.lower():
        raise ValidationError(
            "expression", f"DTSTART has TZID={tzid} but the schedule's timezone is {name}"
        )
    try:
        local = datetime.strptime(value[:15], "%Y%m%dT%H%M%S" if len(value) > 8 else "%Y%m%d")
    except ValueError:
        raise ValidationError("expression", f"DTSTART {value!r} is not a valid date") from None
    if value.upper().endswith("Z"):  # an instant: read it on the schedule's wall clock
        return local.replace(tzinfo=UTC).astimezone(where).replace(tzinfo=None)
    return local


def _parts(body: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for item in body.split(";"):
        key, eq, value = item.partition("=")
        if not eq or not value or key in parts:
            raise ValidationError(
                "expression", f"RRULE part {item!r} is not KEY=VALUE (or repeats)"
            )
        parts[key] = value
    if "FREQ" not in parts:
        raise ValidationError("expression", "an RRULE needs FREQ (e.g. FREQ=DAILY)")
    interval = parts.get("INTERVAL", "1")
    if not _is_number(interval) or not 1 <= int(interval) <= MAX_INTERVAL:
        raise ValidationError(
            "expression",
            f"INTERVAL={interval} must be a whole number from 1 to {MAX_INTERVAL:,} (a limit of "
            "promptsched; for longer intervals use a coarser FREQ)",
        )
    return parts


def _is_number(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '¹' (which int() rejects) and '٣'."""
    return text.isascii() and text.isdigit()


def _dateutil_rule(parts: dict[str, str], dtstart: datetime) -> du.rrule:
    text = "RRULE:" + ";".join(f"{k}={v}" for k, v in parts.items())
    try:
        rule = du.rrulestr(text, dtstart=dtstart)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ValidationError("expression", f"invalid RRULE {text[6:]!r}: {exc}") from None
    assert isinstance(rule, du.rrule)
    return rule


def _check_ranges(parts: dict[str, str]) -> None:
    """dateutil accepts some out-of-range BY* values (BYHOUR=99) and then fails while iterating."""
    for key, (low, high, signed) in _RANGES.items():
        for item in parts.get(key, "").split(",") if key in parts else ():
            number = item.lstrip("+-")
            ok = _is_number(number) and low <= int(number) <= high and (signed or item == number)
            if not ok:
                raise ValidationError(
                    "expression",
                    f"{key}={parts[key]}: {item!r} must be "
                    + (f"{low}..{high} or -{high}..-{low}" if signed else f"{low}..{high}"),
                )


def _check_possible(parts: dict[str, str]) -> None:
    """Reject day filters that contradict each other (BYMONTH=2;BYMONTHDAY=30) up front.

    dateutil would otherwise iterate day by day up to year 9999 looking for a match. The
    Gregorian calendar repeats every 400 years, so a YEARLY probe over 9600..9999 with the
    same day filters answers "does any day ever match" in at most 400 cheap iterations.
    """
    keys = [k for k in ("BYMONTH", "BYMONTHDAY", "BYYEARDAY", "BYWEEKNO", "BYDAY") if k in parts]
    if len(keys) < 2:
        return  # one in-range filter alone always matches some day
    probe = {k: parts[k] for k in keys}
    if parts["FREQ"] == "MONTHLY" and "BYMONTH" not in probe:
        probe["BYMONTH"] = "1,2,3,4,5,6,7,8,9,10,11,12"  # keeps `2MO` meaning "in the month"
    text = "RRULE:FREQ=YEARLY;" + ";".join(f"{k}={v}" for k, v in probe.items())
    start = datetime(9600, 1, 1)
    if du.rrulestr(text, dtstart=start).after(start, inc=True) is None:
        raise ValidationError(
            "expression",
            "the RRULE never fires: no date matches " + ";".join(f"{k}={parts[k]}" for k in keys),
        )


def _check_phase(parts: dict[str, str], dtstart: datetime) -> None:
    """DAILY with an INTERVAL of whole weeks only ever reaches DTSTART's weekday."""
    if parts["FREQ"] != "DAILY" or "BYDAY" not in parts or int(parts.get("INTERVAL", "1")) % 7:
        return
    weekday = _WEEKDAYS[dtstart.weekday()]
    if not any(day.endswith(weekday) for day in parts["BYDAY"].split(",")):
        raise ValidationError(
            "expression",
            f"the RRULE never fires: INTERVAL={parts['INTERVAL']} days from DTSTART "
            f"(a {weekday}) never lands on BYDAY={parts['BYDAY']}",
        )


def _until(text: str, where: tzinfo) -> tuple[datetime | None, datetime]:
    """UNTIL as (exact UTC end or None, naive local bound for dateutil)."""
    match = _UNTIL.fullmatch(text)
    try:
        assert match is not None
        local = datetime.strptime(match["date"] + (match["time"] or "235959"), "%Y%m%d%H%M%S")
    except (AssertionError, ValueError):
        raise ValidationError(
            "expression", f"UNTIL={text} is not a date like 20261231T235959Z"
        ) from None
    if not match["time"]:  # a date: the whole of that local day is included
        return None, local
    if match["z"]:
        instant = local.replace(tzinfo=UTC)
        # dateutil compares naive local times; pad past any fold and filter exactly later
        bound = instant.astimezone(where).replace(tzinfo=None) + zone.MAX_SHIFT
        return instant, bound
    return None, local


def _count(text: str) -> int:
    if not _is_number(text) or not 1 <= int(text) <= MAX_COUNT:
        raise ValidationError("expression", f"COUNT={text} must be between 1 and {MAX_COUNT}")
    return int(text)


def _last_of(rule: du.rrule, count: int) -> datetime:
    """The COUNT-th occurrence, or the last one before the end of the supported range."""
    total = limits.COUNT_BUDGET
    try:
        last = deque(islice(bounded(rule, total=total), count), maxlen=1)
    except expand.Exhausted:
        raise ValidationError(
            "expression",
            f"COUNT={count}: finding the last of {count} fire times needs more than "
            f"{total:,} steps of work; use a smaller COUNT, or UNTIL",
        ) from None
    if not last:
        raise ValidationError("expression", f"the RRULE never fires before {limits.LAST_YEAR}")
    return last[0]


def bounded(rule: du.rrule, *, total: int | None = None) -> Iterator[datetime]:
    """The rule's occurrences through limits.LAST_YEAR, each found within the search budget;
    raises ValidationError("expression", ...) for a rule that fires too rarely for its FREQ
    (and expand.Exhausted when all of it takes more than ``total`` steps)."""
    try:
        yield from expand.occurrences(
            rule, budget=limits.SEARCH_BUDGET, last_year=limits.LAST_YEAR, total=total
        )
    except expand.Exhausted as exc:
        if not exc.gap:
            raise
        raise ValidationError("expression", too_rare(rule, exc)) from None
    except ValueError as exc:  # dateutil: BYHOUR/BYMINUTE/BYSECOND unreachable with INTERVAL
        raise ValidationError("expression", f"the RRULE never fires: {exc}") from None


def too_rare(rule: du.rrule, exc: expand.Exhausted) -> str:
    freq = _FREQS[rule._freq]  # type: ignore[attr-defined]
    days = (exc.reached - exc.start).days
    span = f"{days // 365} years" if days >= 730 else f"{days} days" if days > 1 else "a day"
    return (
        f"the RRULE fires less than once in {span} for FREQ={freq} (no fire time from "
        f"{exc.start:%Y-%m-%d} to {exc.reached:%Y-%m-%d}, and the search for the next one stops "
        f"after {limits.SEARCH_BUDGET:,} steps); use a coarser FREQ, e.g. FREQ=DAILY with "
        "BYHOUR/BYMINUTE/BYSECOND"
    )


def _defaults(parts: dict[str, str], freq: int, dtstart: datetime) -> dict[str, Any]:
    """The BY* values dateutil derives from DTSTART, so a restarted rule keeps them."""
    found: dict[str, Any] = {}
    day_keys = ("BYWEEKNO", "BYYEARDAY", "BYMONTHDAY", "BYDAY", "BYEASTER")
    if not any(k in parts for k in day_keys):
        if freq == du.YEARLY:
            if "BYMONTH" not in parts:
                found["bymonth"] = dtstart.month
            found["bymonthday"] = dtstart.day
        elif freq == du.MONTHLY:
            found["bymonthday"] = dtstart.day
        elif freq == du.WEEKLY:
            found["byweekday"] = dtstart.weekday()
    for key, unit, value in (
        ("BYHOUR", du.HOURLY, dtstart.hour),
        ("BYMINUTE", du.MINUTELY, dtstart.minute),
        ("BYSECOND", du.SECONDLY, dtstart.second),
    ):
        if freq < unit and key not in parts:
            found[key.lower()] = value
    return found
