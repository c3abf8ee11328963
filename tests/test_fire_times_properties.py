"""Property tests: fire_times against a brute-force walker that steps real UTC time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from dateutil import rrule as du
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptsched.schedule import fire_times, spec

MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
# zone -> years with DST transitions worth walking across (Kolkata and UTC have none)
ZONES = {
    "America/New_York": (2026,),
    "Europe/London": (2026,),
    "Australia/Lord_Howe": (2026,),  # 30-minute shifts
    "America/Sao_Paulo": (2017, 2018),  # DST started and ended at midnight
    "Australia/Sydney": (2026,),
    "Asia/Kolkata": (2026,),
    "UTC": (2026,),
}
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)

# --- the reference: the contract's rules applied literally at every step of real time ---


def walk(
    matches: Callable[[datetime], bool],
    zone: ZoneInfo,
    real_time: bool,
    gap: str,
    fold: str,
    start: datetime,
    end: datetime,
    step: timedelta,
) -> list[datetime]:
    """Every fire in [start, end] (start aligned to `step`), found by stepping UTC time."""
    fires: list[datetime] = []
    prev_local = (start - step).astimezone(zone)
    u = start
    while u <= end:
        local = u.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        repeated = local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()
        jumped = local.utcoffset() > prev_local.utcoffset()  # type: ignore[operator]
        if matches(wall) and (real_time or not repeated or fold == "both"):
            fires.append(u)
        elif jumped and not real_time and gap == "shift":
            # u is the first instant after a spring-forward gap: fire if the gap held a match
            t = prev_local.replace(tzinfo=None, fold=0) + step
            while t < wall and not matches(t):
                t += step
            if t < wall:
                fires.append(u)
        prev_local, u = local, u + step
    return fires


def field_values(text: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        base, _, step = item.partition("/")
        if base == "*":
            first, last = low, high
        elif "-" in base:
            first, last = (int(x) for x in base.split("-"))
        else:
            first = int(base)
            last = high if step else first
        values.update(range(first, last + 1, int(step or 1)))
    return values


def cron_matcher(expression: str) -> Callable[[datetime], bool]:
    fields = expression.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    sec, minute, hour, dom, month, dow = fields
    sets = [
        field_values(sec, 0, 59),
        field_values(minute, 0, 59),
        field_values(hour, 0, 23),
        field_values(dom, 1, 31),
        field_values(month, 1, 12),
        {d % 7 for d in field_values(dow, 0, 7)},
    ]
    either = not (dom.startswith("*") or dow.startswith("*"))

    def matches(t: datetime) -> bool:
        day_ok = (t.day in sets[3], (t.weekday() + 1) % 7 in sets[5])
        return (
            t.second in sets[0]
            and t.minute in sets[1]
            and t.hour in sets[2]
            and t.month in sets[4]
            and (any(day_ok) if either else all(day_ok))
        )

    return matches


# --- strategies ---


@cache
def transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    """Offset changes in a year, found by an hourly probe (independent of promptsched)."""
    zone = ZoneInfo(zone_name)
    found = []
    u = datetime(year, 1, 1, tzinfo=UTC)
    while u.year == year:
        nxt = u + timedelta(hours=1)
        if u.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            lo = u
            while nxt - lo > MINUTE:
                mid = lo + (nxt - lo) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid.astimezone(zone).utcoffset() == u.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    nxt = mid
            found.append(nxt)
        u += timedelta(hours=1)
    return tuple(found)


@st.composite
def starts(
    draw: st.DrawFn, step: timedelta = MINUTE, before_hours: int = 30
) -> tuple[str, datetime]:
    """A zone and a UTC instant (aligned to `step`) shortly before one of its transitions."""
    zone_name = draw(st.sampled_from(sorted(ZONES)))
    year = draw(st.sampled_from(ZONES[zone_name]))
    changes = transitions(zone_name, year)
    base = draw(st.sampled_from(changes)) if changes else datetime(year, 3, 29, 1, tzinfo=UTC)
    seconds = draw(st.integers(-before_hours * 3600, 3 * 3600))
    start = base + timedelta(seconds=seconds)
    start -= (start - datetime(2000, 1, 1, tzinfo=UTC)) % step
    return zone_name, start


def _values(low: int, high: int, near: tuple[int, ...] = ()) -> st.SearchStrategy[str]:
    value = st.sampled_from(near) if near else st.integers(low, high)
    value = st.one_of(value, st.integers(low, high))
    small_step = st.integers(1, max(1, (high - low) // 3))
    return st.one_of(
        st.just("*"),
        value.map(str),
        st.lists(value, min_size=2, max_size=4, unique=True).map(
            lambda xs: ",".join(map(str, sorted(xs)))
        ),
        st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        small_step.map(lambda k: f"*/{k}"),
        st.tuples(value, small_step).map(lambda vk: f"{vk[0]}/{vk[1]}"),
        st.tuples(value, value, small_step).map(lambda t: f"{min(t[:2])}-{max(t[:2])}/{t[2]}"),
    )


HOURS_NEAR_TRANSITIONS = (0, 1, 2, 3, 22, 23)
CRON5 = st.tuples(
    _values(0, 59, (0, 15, 30, 45, 59)),
    _values(0, 23, HOURS_NEAR_TRANSITIONS),
    st.one_of(st.just("*"), st.just("*"), st.integers(1, 31).map(str), st.just("1-15")),
    st.just("*"),
    st.sampled_from(["*", "*", "*", "1-5", "0,6", "6"]),
).map(" ".join)
GAPS = st.sampled_from(["shift", "skip"])
FOLDS = st.sampled_from(["first", "both"])


def _expected(
    s: spec.Spec, matches: Callable[[datetime], bool], real_time: bool, start: datetime, hours: int
) -> tuple[list[datetime], datetime]:
    end = start + timedelta(hours=hours)
    step = SECOND if len(s.expression.split()) == 6 else MINUTE
    zone = ZoneInfo(s.timezone)
    return walk(matches, zone, real_time, s.dst_gap, s.dst_fold, start, end, step), end


def _got(s: spec.Spec, start: datetime, end: datetime) -> list[datetime]:
    found = []
    for t in fire_times.iter_after(s, start - timedelta(microseconds=1)):
        if t > end:
            break
        found.append(t)
    return found


def _check_everything(
    s: spec.Spec, expected: list[datetime], start: datetime, end: datetime, data: st.DataObject
) -> None:
    assert _got(s, start, end) == expected
    # next_after from arbitrary instants (including second passes of folds), in local form
    zone = ZoneInfo(s.timezone)
    for _ in range(3):
        after = start + timedelta(
            seconds=data.draw(st.integers(0, int((end - start).total_seconds())))
        )
        after += timedelta(microseconds=data.draw(st.sampled_from([0, 1, 500_000])))
        later = [t for t in expected if t > after]
        if later:
            assert fire_times.next_after(s, after.astimezone(zone)) == later[0], after
    # counts and the latest-n helper agree with the walk
    a = (start + (end - start) * data.draw(st.floats(0, 0.5))).astimezone(zone)
    b = (end - (end - start) * data.draw(st.floats(0, 0.5))).astimezone(zone)
    inside = [t for t in expected if a <= t <= b]
    assert fire_times.count_between(s, a, b, limit=10**6) == (len(inside), True)
    n = data.draw(st.integers(1, 5))
    assert fire_times.last_between(s, a, b, n) == inside[-n:]


# --- the properties ---


@SETTINGS
@given(where=starts(), expression=CRON5, gap=GAPS, fold=FOLDS, data=st.data())
def test_cron_matches_brute_force_walker(
    where: tuple[str, datetime], expression: str, gap: str, fold: str, data: st.DataObject
) -> None:
    zone_name, start = where
    s = spec.parse("cron", expression, zone_name, dst_gap=gap, dst_fold=fold)
    real_time = expression.split()[1] == "*"
    expected, end = _expected(s, cron_matcher(expression), real_time, start, 48)
    _check_everything(s, expected, start, end, data)


CRON6 = st.tuples(
    _values(0, 59, (0, 30)).filter(lambda f: f not in ("*", "*/1")),
    _values(0, 59, (0, 1, 30, 59)).filter(lambda f: f not in ("*", "*/1")),
    _values(0, 23, HOURS_NEAR_TRANSITIONS),
    st.just("*"),
    st.just("*"),
    st.just("*"),
).map(" ".join)


@settings(SETTINGS, max_examples=25)
@given(
    where=starts(step=SECOND, before_hours=3),
    expression=CRON6,
    gap=GAPS,
    fold=FOLDS,
    data=st.data(),
)
def test_six_field_cron_matches_walker_second_by_second(
    where: tuple[str, datetime], expression: str, gap: str, fold: str, data: st.DataObject
) -> None:
    zone_name, start = where
    s = spec.parse("cron", expression, zone_name, dst_gap=gap, dst_fold=fold)
    real_time = expression.split()[2] == "*"
    expected, end = _expected(s, cron_matcher(expression), real_time, start, 5)
    _check_everything(s, expected, start, end, data)


@st.composite
def rrules(draw: st.DrawFn) -> tuple[str, bool]:
    freq = draw(st.sampled_from(["DAILY", "HOURLY", "MINUTELY", "WEEKLY"]))
    parts = [f"FREQ={freq}", f"INTERVAL={draw(st.integers(1, 3))}"]
    has_hour = draw(st.booleans()) and freq != "MINUTELY"
    if has_hour:
        if freq == "HOURLY":  # INTERVAL=2;BYHOUR=1 from an even hour never fires (rejected)
            parts[1] = "INTERVAL=1"
        hours = draw(st.lists(st.sampled_from(HOURS_NEAR_TRANSITIONS), min_size=1, max_size=3))
        parts.append("BYHOUR=" + ",".join(map(str, sorted(set(hours)))))
    if freq == "MINUTELY":
        parts[1] = f"INTERVAL={draw(st.sampled_from([7, 15, 30, 45]))}"
    elif draw(st.booleans()):
        minutes = draw(st.lists(st.sampled_from([0, 10, 30, 45]), min_size=1, max_size=2))
        parts.append("BYMINUTE=" + ",".join(map(str, sorted(set(minutes)))))
    if freq == "WEEKLY":
        parts.append("BYDAY=" + draw(st.sampled_from(["SU", "SA,SU", "MO,TU,WE,TH,FR,SA,SU"])))
    real_time = freq in ("HOURLY", "MINUTELY") and not has_hour
    return ";".join(parts), real_time


@SETTINGS
@given(
    where=starts(), rule=rrules(), gap=GAPS, fold=FOLDS, dt_days=st.integers(0, 400), data=st.data()
)
def test_rrule_matches_brute_force_walker(
    where: tuple[str, datetime],
    rule: tuple[str, bool],
    gap: str,
    fold: str,
    dt_days: int,
    data: st.DataObject,
) -> None:
    zone_name, start = where
    body, real_time = rule
    dtstart = (start - timedelta(days=dt_days)).astimezone(ZoneInfo(zone_name))
    dtstart = dtstart.replace(tzinfo=None, fold=0, second=0, microsecond=0)
    text = f"DTSTART:{dtstart:%Y%m%dT%H%M%S}\nRRULE:{body}"
    s = spec.parse("rrule", text, zone_name, dst_gap=gap, dst_fold=fold)
    # the reference reads occurrences straight from dateutil, from the original DTSTART
    lo = start.astimezone(ZoneInfo(zone_name)).replace(tzinfo=None) - timedelta(days=1)
    occurrences = set(
        du.rrulestr(f"RRULE:{body}", dtstart=dtstart).between(lo, lo + timedelta(days=4), inc=True)
    )
    expected, end = _expected(s, occurrences.__contains__, real_time, start, 48)
    _check_everything(s, expected, start, end, data)


@pytest.mark.parametrize("zone_name", sorted(ZONES))
def test_reference_walker_sees_the_transitions(zone_name: str) -> None:
    """Guards the test itself: zones with DST must offer transitions to start near."""
    has_dst = zone_name not in ("Asia/Kolkata", "UTC")
    assert bool(transitions(zone_name, ZONES[zone_name][0])) == has_dst


@SETTINGS
@given(
    period=st.integers(1, 4 * 3600),
    where=starts(),
    span=st.integers(0, 10 * 86400),
    anchor=st.none() | st.integers(-(10**6), 10**6),
)
def test_every_counts_and_steps_in_real_time(
    period: int, where: tuple[str, datetime], span: int, anchor: int | None
) -> None:
    zone_name, start = where
    text = f"{period}s" + (
        "" if anchor is None else f" from {datetime.fromtimestamp(1.8e9 + anchor, UTC).isoformat()}"
    )
    s = spec.parse("every", text, zone_name)
    end = start + timedelta(seconds=span)
    fires = fire_times.preview(s, start, 3)
    assert all(b - a == timedelta(seconds=period) for a, b in zip(fires, fires[1:], strict=False))
    count, exact = fire_times.count_between(s, start, end, limit=10**9)
    first = fire_times.next_after(s, start - timedelta(microseconds=1))
    assert first is not None
    walked = 0 if first > end else (end - first) // timedelta(seconds=period) + 1
    assert (count, exact) == (walked, True)
