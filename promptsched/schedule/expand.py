"""Bounded expansion of a dateutil rrule: its occurrences, with a hard budget of work and range.

dateutil's own iterator examines one period (or, when day filters reject a day, one day) per
step, and for SECONDLY/MINUTELY rules walks up to a day of seconds between periods; it only
stops at year 9999. A sparse rule (FREQ=SECONDLY with BYMONTH/BYMONTHDAY/BYDAY that meet once
in decades) ran for minutes without yielding. This is dateutil 2.9's ``rrule._iter``
(python-dateutil, Apache-2.0 / BSD-3-Clause, Copyright (c) Gustavo Niemeyer and the
dateutil contributors), with the same results, plus two bounds: every step of work is counted
and the search raises ``Exhausted`` once it passes ``budget``, and it ends at ``last_year``.
"""
# ruff: noqa: C901  (kept close to dateutil's loop so the two can be compared line by line)

from __future__ import annotations

import calendar
import datetime
import math
from collections.abc import Iterator
from typing import Any

from dateutil import rrule as du

_iterinfo: Any = getattr(du, "_iterinfo")  # noqa: B009  # dateutil's per-year day masks


_PERIOD = 8  # a period costs about as much as 8 steps of the second/minute walk (measured)


class Exhausted(Exception):
    """The search used its budget before finding the next occurrence (or its total)."""

    def __init__(self, start: datetime.datetime, reached: datetime.datetime, *, gap: bool) -> None:
        super().__init__(f"no occurrence from {start} to {reached}")
        self.start = start
        self.reached = reached
        self.gap = gap  # True: between two occurrences; False: the total ran out


def _mod_distance(interval: int, value: int, byxxx: Any, base: int) -> tuple[int, int, int]:
    """dateutil's ``rrule.__mod_distance``, also returning the steps it took."""
    accumulator = 0
    for step in range(1, base + 1):
        div, value = divmod(value + interval, base)
        accumulator += div
        if value in byxxx:
            return accumulator, value, step
    raise ValueError("Invalid rrule byxxx generates an empty set.")


def occurrences(
    rule: du.rrule, *, budget: int, last_year: int = datetime.MAXYEAR, total: int | None = None
) -> Iterator[datetime.datetime]:
    """The rule's occurrences in order, like ``iter(rule)``; raises Exhausted when the steps
    between two occurrences exceed ``budget`` (or all steps exceed ``total``), and ends after
    ``last_year``."""
    r: Any = rule
    year, month, day, hour, minute, second, weekday, _, _ = r._dtstart.timetuple()
    freq, interval, until, count = r._freq, r._interval, r._until, r._count
    wkst, bymonth, byweekno, byyearday = r._wkst, r._bymonth, r._byweekno, r._byyearday
    byweekday, byeaster, bymonthday = r._byweekday, r._byeaster, r._bymonthday
    bynmonthday, bysetpos = r._bynmonthday, r._bysetpos
    byhour, byminute, bysecond = r._byhour, r._byminute, r._bysecond
    last_year = min(last_year, datetime.MAXYEAR)
    steps = spent = 0
    total = total if total is not None else -1
    start = r._dtstart

    ii = _iterinfo(rule)
    ii.rebuild(year, month)
    getdayset = {
        du.YEARLY: ii.ydayset,
        du.MONTHLY: ii.mdayset,
        du.WEEKLY: ii.wdayset,
    }.get(freq, ii.ddayset)
    if freq < du.HOURLY:
        timeset = r._timeset
    else:
        gettimeset = {du.HOURLY: ii.htimeset, du.MINUTELY: ii.mtimeset}.get(freq, ii.stimeset)
        if (
            (byhour and hour not in byhour)
            or (freq >= du.MINUTELY and byminute and minute not in byminute)
            or (freq >= du.SECONDLY and bysecond and second not in bysecond)
        ):
            timeset = ()
        else:
            timeset = gettimeset(hour, minute, second)

    while True:
        dayset, first, end = getdayset(year, month, day)
        steps += _PERIOD + (end - first) // 4  # a period, and its day filter below
        if steps > budget or 0 <= total < spent + steps:
            reached = datetime.datetime(year, month, min(day, 28))
            raise Exhausted(start, reached, gap=steps > budget)

        filtered = False
        for i in dayset[first:end]:
            if (
                (bymonth and ii.mmask[i] not in bymonth)
                or (byweekno and not ii.wnomask[i])
                or (byweekday and ii.wdaymask[i] not in byweekday)
                or (ii.nwdaymask and not ii.nwdaymask[i])
                or (byeaster and not ii.eastermask[i])
                or (
                    (bymonthday or bynmonthday)
                    and ii.mdaymask[i] not in bymonthday
                    and ii.nmdaymask[i] not in bynmonthday
                )
                or (
                    byyearday
                    and (
                        (
                            i < ii.yearlen
                            and i + 1 not in byyearday
                            and -ii.yearlen + i not in byyearday
                        )
                        or (
                            i >= ii.yearlen
                            and i + 1 - ii.yearlen not in byyearday
                            and -ii.nextyearlen + i - ii.yearlen not in byyearday
                        )
                    )
                )
            ):
                dayset[i] = None
                filtered = True

        found: list[datetime.datetime] = []
        if bysetpos and timeset:
            for pos in bysetpos:
                daypos, timepos = divmod(pos if pos < 0 else pos - 1, len(timeset))
                try:
                    i = [x for x in dayset[first:end] if x is not None][daypos]
                    time = timeset[timepos]
                except IndexError:
                    pass
                else:
                    date = datetime.date.fromordinal(ii.yearordinal + i)
                    res = datetime.datetime.combine(date, time)
                    if res not in found:
                        found.append(res)
            found.sort()
        else:
            for i in dayset[first:end]:
                if i is not None:
                    date = datetime.date.fromordinal(ii.yearordinal + i)
                    found.extend(datetime.datetime.combine(date, time) for time in timeset)
        for res in found:
            if until and res > until:
                return
            if res >= r._dtstart:
                if count is not None:
                    count -= 1
                    if count < 0:
                        return
                spent, steps = spent + steps, 0
                start = res
                yield res

        fixday = False
        if freq == du.YEARLY:
            year += interval
            if year > last_year:
                return
            ii.rebuild(year, month)
        elif freq == du.MONTHLY:
            month += interval
            if month > 12:
                div, mod = divmod(month, 12)
                month = mod
                year += div
                if month == 0:
                    month = 12
                    year -= 1
                if year > last_year:
                    return
            ii.rebuild(year, month)
        elif freq == du.WEEKLY:
            if wkst > weekday:
                day += -(weekday + 1 + (6 - wkst)) + interval * 7
            else:
                day += -(weekday - wkst) + interval * 7
            weekday = wkst
            fixday = True
        elif freq == du.DAILY:
            day += interval
            fixday = True
        elif freq == du.HOURLY:
            if filtered:  # jump to one iteration before the next day
                hour += ((23 - hour) // interval) * interval
            if byhour:
                ndays, hour, taken = _mod_distance(interval, hour, byhour, 24)
                steps += taken
            else:
                ndays, hour = divmod(hour + interval, 24)
            if ndays:
                day += ndays
                fixday = True
            timeset = gettimeset(hour, minute, second)
        elif freq == du.MINUTELY:
            if filtered:
                minute += ((1439 - (hour * 60 + minute)) // interval) * interval
            valid = False
            rep_rate = 24 * 60
            for _ in range(rep_rate // math.gcd(interval, rep_rate)):
                steps += 1
                if byminute:
                    nhours, minute, taken = _mod_distance(interval, minute, byminute, 60)
                    steps += taken
                else:
                    nhours, minute = divmod(minute + interval, 60)
                div, hour = divmod(hour + nhours, 24)
                if div:
                    day += div
                    fixday = True
                    filtered = False
                if not byhour or hour in byhour:
                    valid = True
                    break
            if not valid:
                raise ValueError(
                    "Invalid combination of interval and byhour resulting in empty rule."
                )
            timeset = gettimeset(hour, minute, second)
        elif freq == du.SECONDLY:
            if filtered:
                second += ((86399 - (hour * 3600 + minute * 60 + second)) // interval) * interval
            rep_rate = 24 * 3600
            valid = False
            for _ in range(rep_rate // math.gcd(interval, rep_rate)):
                steps += 1
                if bysecond:
                    nminutes, second, taken = _mod_distance(interval, second, bysecond, 60)
                    steps += taken
                else:
                    nminutes, second = divmod(second + interval, 60)
                div, minute = divmod(minute + nminutes, 60)
                if div:
                    hour += div
                    div, hour = divmod(hour, 24)
                    if div:
                        day += div
                        fixday = True
                if (
                    (not byhour or hour in byhour)
                    and (not byminute or minute in byminute)
                    and (not bysecond or second in bysecond)
                ):
                    valid = True
                    break
            if not valid:
                raise ValueError(
                    "Invalid combination of interval, byhour and byminute resulting in empty rule."
                )
            timeset = gettimeset(hour, minute, second)

        if fixday and day > 28:
            daysinmonth = calendar.monthrange(year, month)[1]
            if day > daysinmonth:
                while day > daysinmonth:
                    day -= daysinmonth
                    month += 1
                    if month == 13:
                        month = 1
                        year += 1
                        if year > last_year:
                            return
                    daysinmonth = calendar.monthrange(year, month)[1]
                ii.rebuild(year, month)
