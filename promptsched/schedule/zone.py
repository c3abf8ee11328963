"""Mapping local wall-clock times to real instants across DST gaps and folds (zoneinfo only)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import NamedTuple
from zoneinfo import ZoneInfo

MAX_SHIFT = timedelta(hours=3)  # larger than any DST fold or gap since 1970 (Troll: 2h)
_PROBE = timedelta(days=7)  # zones never change offset twice within a week (post-1970 tzdata)
_US = timedelta(microseconds=1)


class Transition(NamedTuple):
    at: datetime  # first instant (UTC) with the new offset
    before: timedelta
    after: timedelta

    @property
    def local_before(self) -> datetime:
        """The naive local wall time the clock would show at `at` under the old offset."""
        return (self.at + self.before).replace(tzinfo=None)

    @property
    def local_after(self) -> datetime:
        return (self.at + self.after).replace(tzinfo=None)


class Local(NamedTuple):
    kind: int  # NORMAL, GAP or FOLD
    first: datetime  # F(t): the first instant whose local time is >= t (UTC)
    second: datetime | None  # the second occurrence of a repeated local time


NORMAL, GAP, FOLD = 0, 1, 2


def is_fixed(zone: tzinfo) -> bool:
    return isinstance(zone, ZoneInfo) and zone.key in ("UTC", "Etc/UTC", "Etc/GMT", "GMT")


def offset_at(zone: tzinfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def locate(zone: tzinfo, local: datetime) -> Local:
    """Classify a naive local time and give its instants (see `Local`)."""
    early = local.replace(tzinfo=zone).utcoffset()
    late = local.replace(tzinfo=zone, fold=1).utcoffset()
    assert early is not None and late is not None
    if early == late:
        return Local(NORMAL, (local - early).replace(tzinfo=UTC), None)
    if early > late:  # fold: fold=0 is the first occurrence (PEP 495)
        return Local(FOLD, (local - early).replace(tzinfo=UTC), (local - late).replace(tzinfo=UTC))
    # gap: fold=0 reads the time with the old offset, which lands after the transition
    hi, lo = (local - early).replace(tzinfo=UTC), (local - late).replace(tzinfo=UTC)
    return Local(GAP, transition_between(zone, lo, hi).at, None)


def transition_between(zone: tzinfo, lo: datetime, hi: datetime) -> Transition:
    """The one offset change in (lo, hi]; transitions fall on whole seconds."""
    before, after = offset_at(zone, lo), offset_at(zone, hi)
    lo_s, hi_s = math.floor(lo.timestamp()), math.ceil(hi.timestamp())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if offset_at(zone, datetime.fromtimestamp(mid, UTC)) == after:
            hi_s = mid
        else:
            lo_s = mid
    return Transition(datetime.fromtimestamp(hi_s, UTC), before, after)


def high_water(zone: tzinfo, instant: datetime) -> datetime:
    """The latest naive local time the clock has shown up to `instant`.

    Normally the local time of `instant`; during the second pass of a fold it is just below
    the top of the fold, because those local times were already shown once.
    """
    local = instant.astimezone(zone)
    if local.fold:
        early, late = local.replace(fold=0).utcoffset(), local.utcoffset()
        assert early is not None and late is not None
        if early > late:
            change = transition_between(zone, instant - (early - late), instant)
            return change.local_before - _US
    return local.replace(tzinfo=None)


def fold_near(zone: tzinfo, instant: datetime) -> Transition | None:
    """A backward offset change within MAX_SHIFT of `instant`, if there is one."""
    lo, hi = instant - MAX_SHIFT, instant + MAX_SHIFT
    if offset_at(zone, lo) <= offset_at(zone, hi):
        return None
    return transition_between(zone, lo, hi)


def transitions(zone: tzinfo, start: datetime, end: datetime) -> list[Transition]:
    """Every offset change in (start, end], in order."""
    if is_fixed(zone):
        return []
    found: list[Transition] = []
    for year in range(start.year, end.year + 1):
        found.extend(t for t in _year_transitions(zone, year) if start < t.at <= end)
    return found


@lru_cache(maxsize=1024)
def _year_transitions(zone: tzinfo, year: int) -> tuple[Transition, ...]:
    if year < 1900 or year > 9000:
        return ()
    found: list[Transition] = []
    # probe (Jan 1 - 1s, next Jan 1 - 1s]: a change at exactly midnight UTC belongs to its year
    lo = datetime(year, 1, 1, tzinfo=UTC) - timedelta(seconds=1)
    end = datetime(year + 1, 1, 1, tzinfo=UTC) - timedelta(seconds=1)
    lo_offset = offset_at(zone, lo)
    while lo < end:
        hi = min(lo + _PROBE, end)
        hi_offset = offset_at(zone, hi)
        if hi_offset != lo_offset:
            found.append(transition_between(zone, lo, hi))
        lo, lo_offset = hi, hi_offset
    return tuple(found)
