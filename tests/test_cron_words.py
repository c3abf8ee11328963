"""A cron expression's words are exact: read back as a person would read them, every sentence
names exactly the next 50 fire times, in any zone (DST included), and the console shows the
same words and the same times. A step larger than its field's range is refused at save time."""

from __future__ import annotations

import bisect
import calendar
import heapq
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from promptsched.errors import ValidationError
from promptsched.human import describe
from promptsched.schedule import cron, fire_times, spec
from tests import console_support, factories
from tests.test_fire_times_properties import ZONES, transitions

FIRES = 50
EPOCH = date(1970, 1, 1)
_DAY_NAMES = {n: i for i, n in enumerate(calendar.day_name)}  # Python numbering: Monday = 0
_MONTH_NAMES = {calendar.month_name[i]: i for i in range(1, 13)}
_UNIT = {"second": 1, "minute": 60, "hour": 3600}

# --- the words, read back as a reader would: an independent interpreter of the sentences ---


@dataclass
class Reading:
    """What a sentence promises: which days, and which times of such a day."""

    day: Callable[[date], bool]
    times: Callable[[date, int], Iterator[int]]  # seconds since local midnight, ascending,
    # from the second given on


def _clock(text: str) -> int:
    parts = [int(p) for p in text.split(":")]
    return parts[0] * 3600 + parts[1] * 60 + (parts[2] if len(parts) > 2 else 0)


def _items(text: str) -> list[str]:
    head, _, last = text.rpartition(" and ")
    return [*head.split(", "), last] if head else [last]


def _named(text: str, names: dict[str, int]) -> set[int]:
    values: set[int] = set()
    for item in _items(text):
        first, _, last = item.partition(" through ")
        low, high = names[first], names[last or first]
        values.update(range(low, high + 1) if low <= high else [*range(low, 7), *range(high + 1)])
    return values


def _days(text: str) -> Callable[[date], bool]:
    """`on weekdays (Monday to Friday)`, `on Monday and Friday`, `on day 5 of the month`,
    `on the last day of the month`, `in January through March` (all of them must hold)."""
    weekdays, months, monthday = set(range(7)), set(range(1, 13)), 0  # 0: any, -1: the last
    rest = text.strip()
    while rest:
        if m := re.match(r"on weekdays \(Monday to Friday\)", rest):
            weekdays = set(range(5))
        elif m := re.match(r"on weekends", rest):
            weekdays = {5, 6}
        elif m := re.match(r"on day (\d+) of the month", rest):
            monthday = int(m.group(1))
        elif m := re.match(r"on the last day of the month", rest):
            monthday = -1
        elif m := re.match(r"on ((?:[A-Z][a-z]+day(?:, | and | through )?)+)", rest):
            weekdays = _named(m.group(1), _DAY_NAMES)
        elif m := re.match(r"in ((?:[A-Z][a-z]+(?:, | and | through )?)+)", rest):
            months = _named(m.group(1), _MONTH_NAMES)
        else:
            raise AssertionError(f"unreadable day words {rest!r} in {text!r}")
        rest = rest[m.end() :].strip()

    def day(d: date) -> bool:
        last = calendar.monthrange(d.year, d.month)[1]
        return (
            d.weekday() in weekdays
            and d.month in months
            and monthday in (0, d.day, -1 if d.day == last else 0)
        )

    return day


def _spaced(period: int, offset: int, low: int, high: int) -> Callable[[date, int], Iterator[int]]:
    """`every N units`: instants `period` seconds apart without a break, across midnight too
    (counted from 1970-01-01 00:00), kept when their time of day is in [low, high]."""

    def times(d: date, since: int) -> Iterator[int]:
        start = (d - EPOCH).days * 86400
        first = start + max(since, low)
        t = first + (offset - first) % period
        while t < start + 86400:
            if low <= t - start <= high:
                yield t - start
            t += period

    return times


def _listed(values: list[int]) -> Callable[[date, int], Iterator[int]]:
    ordered = sorted(values)
    return lambda d, since: iter(ordered[bisect.bisect_left(ordered, since) :])


def _each(unit: int, values: list[int], low: int, high: int) -> list[int]:
    """`at minutes 0 and 30 past each hour`: those offsets in every hour (minute) of [low, high]."""
    outer = 3600 if unit == 60 else 60
    return [b + v * unit for b in range(0, 86400, outer) for v in values if low <= b <= high]


def _time_words(text: str) -> Callable[[date], Iterator[int]]:
    low, high = 0, 86399
    if m := re.search(r" from (\d\d):00 to (\d\d):59", text):
        low, high = int(m.group(1)) * 3600, int(m.group(2)) * 3600 + 3599
        text = text[: m.start()] + text[m.end() :]
    if m := re.fullmatch(r"(?:every day )?at ((?:\d\d:\d\d(?::\d\d)?(?:, | and )?)+)", text):
        return _listed([_clock(t) for t in _items(m.group(1))])
    if m := re.fullmatch(r"every (?:(\d+) )?(second|minute|hour)s?", text):
        return _spaced(int(m.group(1) or 1) * _UNIT[m.group(2)], 0, low, high)
    if m := re.fullmatch(r"every (?:(\d+) )?hours?, (?:on the hour|at minute (\d+))", text):
        period = int(m.group(1) or 1) * 3600
        return _spaced(period, int(m.group(2) or 0) * 60, low, high)
    if m := re.fullmatch(r"at (second|minute)s? ([\d, and]+) past each (minute|hour)", text):
        values = [int(v) for v in _items(m.group(2))]
        return _listed(_each(_UNIT[m.group(1)], values, low, high))
    raise AssertionError(f"unreadable time words {text!r}")


MACRO_WORDS = [
    (r"every year on (\d+) ([A-Z][a-z]+) at (\d\d:\d\d)", "in {1} on day {0} of the month"),
    (r"on day (\d+) of every month at (\d\d:\d\d)", "on day {0} of the month"),
    (r"every ([A-Z][a-z]+day) at (\d\d:\d\d)", "on {0}"),
]


def read(sentence: str) -> Reading:
    """The fire times a person would expect from the sentence, as a Reading."""
    for pattern, days in MACRO_WORDS:
        if m := re.fullmatch(pattern, sentence):
            return Reading(_days(days.format(*m.groups())), _listed([_clock(m.groups()[-1])]))
    time_text, day_text = sentence, ""
    if m := re.search(r",? (?=on (?:weekdays|weekends|day \d|the last|[A-Z])|in [A-Z])", sentence):
        time_text, day_text = sentence[: m.start()], sentence[m.end() :]
    return Reading(_days(day_text), _time_words(time_text))


def promised(reading: Reading, s: spec.Spec, after: datetime) -> Iterator[datetime]:
    """The instants the Reading names after `after`, under the DST rules of docs/scheduling.md:
    a wall time the clocks skip fires at the first instant after the gap (`shift`) or not at
    all; a repeated one fires at its first pass (`first`) or at both; an expression whose hour
    field is `*` follows real time (both passes, nothing in a gap)."""
    zone = ZoneInfo(s.timezone)
    real_time = cron.expand_macro(s.expression).split()[-4] == "*"
    gap = "skip" if real_time else s.dst_gap
    fold = "both" if real_time else s.dst_fold
    pending: list[datetime] = []  # a heap
    skip_before = after.astimezone(zone).replace(tzinfo=None) - _FOLD
    day = skip_before.date()
    while day.year < 2200:
        if reading.day(day):
            midnight = datetime(day.year, day.month, day.day)
            since = max(0, int((skip_before - midnight).total_seconds()))
            for offset in reading.times(day, since):
                wall = midnight + timedelta(seconds=offset)
                for t in _instants(wall, zone, gap, fold):
                    heapq.heappush(pending, t)
                # a repeated hour puts a later wall time at an earlier instant: yield in
                # instant order what no later wall time can precede
                here = wall.replace(tzinfo=zone)
                steady = (
                    here.utcoffset() == (here + _FOLD).utcoffset() == (here - _FOLD).utcoffset()
                )
                yield from _flush(pending, here + _US if steady else here - _FOLD, after)
        day += timedelta(days=1)
        if pending:
            bound = datetime(day.year, day.month, day.day, tzinfo=zone) - _FOLD
            yield from _flush(pending, bound, after)


_US = timedelta(microseconds=1)
_FOLD = timedelta(hours=1)  # as long as the longest repeated hour of the corpus's zones


def _flush(pending: list[datetime], bound: datetime, after: datetime) -> Iterator[datetime]:
    while pending and pending[0] < bound:
        t = heapq.heappop(pending)
        if t > after and (not pending or pending[0] != t):
            yield t


def _instants(wall: datetime, zone: ZoneInfo, gap: str, fold: str) -> Iterator[datetime]:
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    exists = first.astimezone(zone).replace(tzinfo=None) == wall
    if not exists:
        if gap == "shift":
            yield _after_gap(min(first, second), max(first, second), zone)
    elif first != second:
        yield min(first, second)
        if fold == "both":
            yield max(first, second)
    else:
        yield first


def _after_gap(low: datetime, high: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the spring-forward gap between two UTC instants."""
    before = low.astimezone(zone).utcoffset()
    while high - low > timedelta(seconds=1):
        mid = low + (high - low) / 2
        mid = mid.replace(microsecond=0)
        if mid.astimezone(zone).utcoffset() == before:
            low = mid
        else:
            high = mid
    return high


# --- the corpus: every field, steps, ranges, lists, seconds, macros, DST zones ---


def _field(low: int, high: int, near: tuple[int, ...]) -> st.SearchStrategy[str]:
    value = st.one_of(st.sampled_from(near), st.integers(low, high))
    step = st.integers(1, high - low)
    return st.one_of(
        st.just("*"),
        value.map(str),
        st.lists(value, min_size=2, max_size=4, unique=True).map(
            lambda xs: ",".join(map(str, sorted(xs)))
        ),
        st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        step.map(lambda k: f"*/{k}"),
        step.map(lambda k: f"0/{k}"),
        st.tuples(value, value, step).map(lambda t: f"{min(t[:2])}-{max(t[:2])}/{t[2]}"),
    )


SECOND = st.one_of(st.just(None), st.just("0"), _field(0, 59, (0, 5, 30, 45)))
MINUTE = _field(0, 59, (0, 15, 30, 45, 59))
HOUR = _field(0, 23, (0, 1, 2, 3, 9, 17, 23))
DOM = st.sampled_from(["*", "*", "*", "1", "15", "29", "30", "31", "L", "1-15", "*/10"])
MONTH = st.sampled_from(["*", "*", "*", "1", "2", "1,7", "jan-mar", "6-8", "*/3", "feb,dec"])
DOW = st.sampled_from(
    ["*", "*", "*", "1-5", "mon-fri", "0,6", "sat,sun", "6", "MON", "1,3,5", "5-7", "0-7", "*/2"]
)
MACRO = st.sampled_from(
    ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]
)
CRON = st.one_of(
    st.tuples(SECOND, MINUTE, HOUR, DOM, MONTH, DOW).map(
        lambda f: " ".join(x for x in f if x is not None)
    ),
    MACRO,
)
# Expressions each corpus draw also covers, the shapes people write most
COMMON = [
    "*/25 * * * *", "*/7 * * * *", "*/45 * * * * *", "0 */5 * * *", "*/15 * * * *",
    "0 9 * * *", "30 7 * * 1-5", "*/5 9-17 * * 1-5", "15 */2 * * *", "0 0 1 * *",
    "0 6 L * *", "*/10 * * * * *", "15,45 * * * * *", "0 9,17 * * *", "@hourly", "@weekly",
    "*/25 9-17 * * *", "0 */7 * * 6", "30 2 * * *", "30 1 * * *", "*/13 * * * * *",
]  # fmt: skip


@st.composite
def cases(draw: st.DrawFn) -> tuple[spec.Spec, datetime]:
    """A valid expression in a zone, and a start near one of the zone's DST changes."""
    expression = draw(st.one_of(st.sampled_from(COMMON), CRON))
    zone_name = draw(st.sampled_from(sorted(ZONES)))
    try:
        parsed = spec.parse(
            "cron",
            expression,
            zone_name,
            dst_gap=draw(st.sampled_from(["shift", "skip"])),
            dst_fold=draw(st.sampled_from(["first", "both"])),
        )
    except ValidationError:
        assume(False)
        raise
    year = draw(st.sampled_from(ZONES[zone_name]))
    changes = transitions(zone_name, year)
    base = draw(st.sampled_from(changes)) if changes else datetime(year, 3, 29, 1, tzinfo=UTC)
    start = base + timedelta(seconds=draw(st.integers(-30 * 3600, 3 * 3600)))
    return parsed, start


SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)


def check_words(words: str, s: spec.Spec, fires: list[datetime], after: datetime) -> None:
    """`fires` are the first fire times after `after`: the words must name exactly them."""
    expected = list(islice(promised(read(words), s, after), len(fires)))
    assert [t.isoformat() for t in expected] == [t.isoformat() for t in fires], (
        f"{s.expression!r} in {s.timezone} ({s.dst_gap}/{s.dst_fold}) reads {words!r}"
    )


@SETTINGS
@given(cases())
def test_every_sentence_names_exactly_the_next_50_fire_times(case: tuple[Any, datetime]) -> None:
    s, start = case
    words = describe.describe("cron", s.expression)
    if words == describe.as_written("cron", s.expression):
        return  # shown as written: exact by construction
    fires = list(islice(fire_times.iter_after(s, start), FIRES))
    check_words(words, s, fires, start)


@pytest.mark.parametrize("zone", ["America/New_York", "Australia/Lord_Howe"])
@pytest.mark.parametrize("expression", COMMON)
def test_the_common_shapes_are_said_in_words_that_are_true(expression: str, zone: str) -> None:
    """The corpus's common shapes get a sentence, true across both DST changes of the year."""
    s = spec.parse("cron", expression, zone, dst_fold="both")
    words = describe.describe("cron", s.expression)
    assert words != s.expression
    for change in transitions(zone, 2026):
        start = change - timedelta(hours=2, seconds=1)
        check_words(words, s, list(islice(fire_times.iter_after(s, start), FIRES)), start)


UNEVEN = [
    ("*/25 * * * *", "at minutes 0, 25 and 50 past each hour"),
    ("*/7 * * * *", "at minutes 0, 7, 14, 21, 28, 35, 42, 49 and 56 past each hour"),
    ("*/45 * * * * *", "at seconds 0 and 45 past each minute"),
    ("0 */5 * * *", "every day at 00:00, 05:00, 10:00, 15:00 and 20:00"),
    ("*/20 * * * *", "every 20 minutes"),
    ("0 */6 * * *", "every 6 hours, on the hour"),
]


@pytest.mark.parametrize(("expression", "words"), UNEVEN, ids=[u[0] for u in UNEVEN])
def test_a_step_that_does_not_divide_its_range_is_said_as_what_it_does(
    expression: str, words: str
) -> None:
    assert describe.describe("cron", expression) == words


TOO_LARGE = [
    ("*/61 * * * *", "minute field '*/61': step 61 is larger than the field's range 0-59"),
    ("*/60 * * * *", "minute field '*/60': step 60"),
    ("0 */24 * * *", "hour field '*/24': step 24"),
    ("0 0 */31 * *", "day-of-month field '*/31': step 31"),
    ("0 0 1 */12 *", "month field '*/12': step 12"),
    ("0 0 * * */8", "day-of-week field '*/8': step 8"),
    ("5/70 * * * * *", "second field '5/70': step 70"),
    ("0 0 9-17/30 * * *", "hour field '9-17/30': step 30"),
]


@pytest.mark.parametrize(("expression", "message"), TOO_LARGE, ids=[t[0] for t in TOO_LARGE])
def test_a_step_larger_than_its_field_is_refused_at_save_time(
    expression: str, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        spec.parse("cron", expression)
    assert caught.value.field == "expression"
    assert message in caught.value.message
    assert "\n" not in caught.value.message


def test_a_stored_large_step_still_fires() -> None:
    """Refused at save time only: a schedule saved before the rule keeps its fire times."""
    stored = spec.Spec("cron", "*/61 * * * *")
    after = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
    assert fire_times.next_after(stored, after) == datetime(2026, 3, 2, 10, tzinfo=UTC)


# --- the console's rendering of the same words ---

CONSOLE_CASES = [
    ("*/25 * * * *", "UTC"),
    ("*/45 * * * * *", "Europe/London"),
    ("0 */5 * * *", "America/New_York"),
    ("30 2 * * *", "America/New_York"),
    ("*/5 9-17 * * 1-5", "Australia/Lord_Howe"),
    ("0 0 1 1,7 *", "UTC"),
    ("15,45 * * * * *", "Asia/Kolkata"),
    ("@weekly", "Europe/London"),
    ("*/7 * * * *", "Australia/Sydney"),
    ("0 6 L * *", "UTC"),
]


async def test_the_console_shows_the_same_exact_words_with_its_fire_times(
    pool: asyncpg.Pool[Any],
) -> None:
    """The form's live preview and the schedule's page say the describer's sentence, and the
    sentence names exactly the fire times the preview lists."""
    async with console_support.console(pool) as c:
        await c.login_as("alice", admin=True)
        for expression, zone in CONSOLE_CASES:
            s = spec.parse("cron", expression, zone)
            words = describe.describe("cron", s.expression)
            assert words != s.expression, expression
            response = await c.client.get(
                "/preview", params={"kind": "cron", "expression": expression, "timezone": zone}
            )
            data = await response.json()
            assert data["description"] == words
            times = [datetime.fromisoformat(t["iso"]) for t in data["fire_times"]]
            assert len(times) >= 5, data
            check_words(data["description"], s, times, times[0] - timedelta(seconds=1))
            sid = await factories.schedule(pool, expression=s.expression, timezone=zone)
            page = await c.get(f"/schedules/{sid}")
            assert words in page.text, expression
