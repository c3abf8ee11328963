"""Fire times of a Spec (next, preview, counts), applying the contract's DST rules."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from itertools import islice
from typing import Protocol

from promptsched.errors import ValidationError
from promptsched.schedule import cron, limits, rrule, spec, zone

# Cron and RRULE are matched on the local wall clock (cron.Cron, rrule.RRule) and mapped to
# instants here:
# * hour field not `*` (RRULE: BYHOUR, or FREQ coarser than HOURLY): a local time in a DST gap
#   fires once at the first instant after the gap (dst_gap="shift") or not at all ("skip"); a
#   repeated local time fires at its first occurrence (dst_fold="first") or at both ("both").
# * hour field `*` (RRULE: HOURLY or finer without BYHOUR): real time. Every instant whose local
#   time matches fires (both passes of a fold, nothing for a gap): the same as skip + both, so
#   dst_gap/dst_fold do not apply.
# With shift + first the fire set is {F(t) : t matches}, F(t) = the first instant whose local
# time is >= t. F is monotone, so the next fire after `a` is F of the first match above the
# highest local time shown up to `a` (zone.high_water). Second passes of folds come separately.
# Every computation runs on UTC instants: in Python `local + timedelta` is wall-clock arithmetic.

_US = timedelta(microseconds=1)
_SECOND = timedelta(seconds=1)


class Pattern(Protocol):
    """A set of naive local wall-clock times (a compiled cron or RRULE)."""

    @property
    def hour_star(self) -> bool: ...

    def next_local(self, after: datetime) -> datetime | None: ...


Compiled = cron.Cron | rrule.RRule | spec.At | spec.Every


@lru_cache(maxsize=4096)
def compiled(s: spec.Spec) -> Compiled:
    """The compiled form of a Spec (cached: specs are hashable and compiling is pure)."""
    where = spec.load_zone(s.timezone)
    if s.kind == "cron":
        return cron.compile_cron(s.expression)
    if s.kind == "rrule":
        return rrule.compile_rrule(s.expression, where)
    if s.kind == "at":
        return spec.compile_at(s.expression, where)
    return spec.compile_every(s.expression, where)


def next_after(s: spec.Spec, after: datetime) -> datetime | None:
    """The first fire time strictly after `after` (aware, any zone) as aware UTC; None if none
    before limits.LATEST, the end of the supported range. Bounded work: a search that needs
    more than limits.SEARCH_BUDGET steps raises ValidationError("expression", ...)."""
    if after.tzinfo is None:
        raise ValueError("`after` must be timezone-aware")
    if after >= limits.LATEST:
        return None
    try:
        # all arithmetic below is on UTC instants: `local + timedelta` is wall-clock arithmetic
        found = _next_after(s, after.astimezone(UTC))
    except OverflowError:
        return None
    return found if found is not None and found < limits.LATEST else None


def _next_after(s: spec.Spec, after: datetime) -> datetime | None:
    c = compiled(s)
    if isinstance(c, spec.At):
        return c.instant if c.instant > after else None
    if isinstance(c, spec.Every):
        return c.next_after(after)
    where = spec.load_zone(s.timezone)
    gap, fold = ("skip", "both") if c.hour_star else (s.dst_gap, s.dst_fold)
    found = _next_pattern(c, where, gap, fold, after)
    until = c.until_utc if isinstance(c, rrule.RRule) else None
    return None if found is None or (until is not None and found > until) else found


def iter_after(s: spec.Spec, after: datetime) -> Iterator[datetime]:
    """Fire times strictly after `after`, in order, until the schedule ends."""
    current = next_after(s, after)
    while current is not None:
        yield current
        current = next_after(s, current)


def preview(s: spec.Spec, after: datetime, count: int) -> list[datetime]:
    """The next `count` fire times strictly after `after`."""
    return list(islice(iter_after(s, after), max(count, 0)))


def _next_pattern(
    p: Pattern, where: tzinfo, gap: str, fold: str, after: datetime
) -> datetime | None:
    if zone.is_fixed(where):
        t = p.next_local(after.astimezone(UTC).replace(tzinfo=None))
        return None if t is None else t.replace(tzinfo=UTC)
    first = _next_first(p, where, gap, zone.high_water(where, after))
    if fold == "both":
        second = _next_second(p, where, after)
        if second is not None and (first is None or second < first):
            return second
    return first


def _next_first(p: Pattern, where: tzinfo, gap: str, local: datetime) -> datetime | None:
    """F(t) for the first match t above `local`, skipping gap times when gap == "skip"."""
    while True:
        t = p.next_local(local)
        if t is None:
            return None
        found = zone.locate(where, t)
        if found.kind != zone.GAP or gap == "shift":
            return found.first
        # skip the whole gap: continue from the local time just after it
        local = found.first.astimezone(where).replace(tzinfo=None) - _US


def _next_second(p: Pattern, where: tzinfo, after: datetime) -> datetime | None:
    """The first second-pass occurrence of a repeated local time strictly after `after`.

    Only a fold within MAX_SHIFT of `after` can hold one that precedes every first occurrence
    still to come (a match whose first occurrence is after `after` fires first there).
    """
    change = zone.fold_near(where, after)
    if change is None:
        return None
    bottom, top = change.local_after, change.local_before  # the repeated range [bottom, top)
    late_local = (after.astimezone(UTC) + change.after).replace(tzinfo=None)
    t = p.next_local(max(late_local, bottom - _US))
    if t is None or t >= top:
        return None
    return (t - change.after).replace(tzinfo=UTC)


def count_between(s: spec.Spec, start: datetime, end: datetime, *, limit: int) -> tuple[int, bool]:
    """Fire times in [start, end] as (count, exact); exact is False only if count > limit.

    Bounded work: closed form for `every` and `at`; cron counts whole days per month in closed
    form and splits the range only at offset changes; RRULE counts cached occurrence windows
    by bisection and stops once the count passes `limit`.
    """
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("`start` and `end` must be timezone-aware")
    c = compiled(s)
    end = min(end, limits.LATEST - _US)
    if end < start:
        total = 0
    elif isinstance(c, spec.At):
        total = int(start <= c.instant <= end)
    elif isinstance(c, spec.Every):
        total = c.count(start, end)
    else:
        total = _count_pattern(s, c, start, end, limit)
    return min(total, limit), total <= limit


def _count_pattern(
    s: spec.Spec, c: cron.Cron | rrule.RRule, start: datetime, end: datetime, limit: int
) -> int:
    where = spec.load_zone(s.timezone)
    gap, fold = ("skip", "both") if c.hour_star else (s.dst_gap, s.dst_fold)
    until = c.until_utc if isinstance(c, rrule.RRule) else None
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    end = min(end, until) if until is not None else end
    changes = zone.transitions(where, start - _US, end)
    # half-open UTC segments of constant offset; fire times are whole seconds
    bounds = [start, *(t.at for t in changes), end.replace(microsecond=0) + _SECOND]
    total = 0
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        offset = zone.offset_at(where, lo)
        lo_local = _ceil_second((lo + offset).replace(tzinfo=None))
        hi_local = _ceil_second((hi + offset).replace(tzinfo=None)) - _SECOND
        change = changes[i - 1] if i else None
        if change is None and fold == "first":  # `start` may lie in a fold's second pass
            lo_local = max(lo_local, _ceil_second(zone.high_water(where, lo)))
        if change is not None and change.after < change.before and fold == "first":
            lo_local = max(lo_local, change.local_before)  # second pass: already fired
        if change is not None and change.after > change.before and gap == "shift":
            total += _shifted_gap(c, change, limit)
        total += _count_local(c, lo_local, hi_local, limit - total)
        if total > limit:
            break
    return total


def _shifted_gap(c: cron.Cron | rrule.RRule, change: zone.Transition, limit: int) -> int:
    """1 if the gap holds a match and the first time after it does not (it fires at once)."""
    inside = _count_local(c, change.local_before, change.local_after - _SECOND, limit)
    at_end = _count_local(c, change.local_after, change.local_after, limit)
    return int(inside > 0 and at_end == 0)


def _count_local(c: cron.Cron | rrule.RRule, lo: datetime, hi: datetime, limit: int) -> int:
    if hi < lo:
        return 0
    if isinstance(c, cron.Cron):
        return c.count_local(lo, hi)
    return c.count_local(lo, hi, max(limit, 0))


def _ceil_second(value: datetime) -> datetime:
    return value if not value.microsecond else value.replace(microsecond=0) + _SECOND


def last_between(s: spec.Spec, start: datetime, end: datetime, n: int) -> list[datetime]:
    """The latest `n` fire times in [start, end], oldest first, without walking every slot.

    Bisects (on whole seconds) for the latest y with at least n fires in [y, end], using
    count_between, then walks at most n + 1 fires from y.
    """
    if n <= 0 or end < start:
        return []
    lo, end = start.astimezone(UTC), end.astimezone(UTC)
    if count_between(s, lo, end, limit=n)[0] >= n:
        hi = end
        while hi - lo > _SECOND:
            mid = lo + (hi - lo) // 2
            if count_between(s, mid, end, limit=n)[0] >= n:
                lo = mid
            else:
                hi = mid
    found: list[datetime] = []
    for t in iter_after(s, lo - _US):
        if t > end:
            break
        found.append(t)
    return found[-n:]


def check_fires(s: spec.Spec, now: datetime) -> datetime:
    """The first fire strictly after `now`; raises ValidationError if the schedule never fires
    before the end of the supported range (limits.LATEST), or fires too rarely to compute."""
    found = next_after(s, now)
    if found is not None:
        return found
    c = compiled(s)
    if isinstance(c, spec.At) and c.instant <= now:
        local = c.instant.astimezone(spec.load_zone(s.timezone))
        raise ValidationError(
            "at", f"that time is past ({local:%Y-%m-%d %H:%M:%S %Z}); give one in the future"
        )
    end = limits.LATEST.isoformat().replace("+00:00", "Z")
    reason = {
        "at": f"the time {s.expression} is already past",
        "rrule": "its COUNT or UNTIL is exhausted, or it matches no date before then",
        "cron": "no date matches it",
        "every": "its first fire time is after that",
    }[s.kind]
    if isinstance(c, spec.At) and c.instant >= limits.LATEST:
        reason = f"{s.expression} is after the supported range"
    raise ValidationError(
        "expression",
        f"the schedule never fires between {now.isoformat()} and {end} (the end of the "
        f"supported range): {reason}",
    )
