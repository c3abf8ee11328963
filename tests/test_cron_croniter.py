"""Differential property test: our cron matcher against croniter, where the two define cron
the same way: UTC (no DST), 5 fields (croniter would read a sixth field as seconds LAST),
numeric values, and the classic day rule (day-of-month OR day-of-week when both are
restricted, AND when either is `*`). Day fields are either `*` or free of `*`: Vixie cron
(and we) treat `*/2` in a day field as unrestricted, a case croniter may read differently."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptsched.schedule import fire_times, spec

FIRES = 6


@st.composite
def field(draw: st.DrawFn, low: int, high: int, *, star_steps: bool = True) -> str:
    """One cron field over [low, high]: `*`, a value, a range, a stepped range, a list,
    and (for non-day fields) a stepped `*`."""
    forms = ["star", "value", "range", "step_range", "list"] + (["star_step"] if star_steps else [])
    form = draw(st.sampled_from(forms))
    value = st.integers(low, high)
    if form == "star":
        return "*"
    if form == "star_step":
        return f"*/{draw(st.integers(1, high - low))}"
    if form == "value":
        return str(draw(value))
    # a < b: croniter reads a one-value range in day-of-week (`0-0`) as every day
    a, b = sorted(draw(st.lists(value, min_size=2, max_size=2, unique=True)))
    if form == "range":
        return f"{a}-{b}"
    if form == "step_range":
        return f"{a}-{b}/{draw(st.integers(1, high - low))}"
    items = draw(st.lists(value, min_size=2, max_size=4, unique=True))
    return ",".join(str(v) for v in items)


@st.composite
def expressions(draw: st.DrawFn) -> str:
    minute = draw(field(0, 59))
    hour = draw(field(0, 23))
    month = draw(field(1, 12))
    # Days 29-31 only when every month may match, so no expression is impossible.
    dom = draw(field(1, 31 if month == "*" else 28, star_steps=False))
    dow = draw(field(0, 6, star_steps=False))
    return f"{minute} {hour} {dom} {month} {dow}"


starts = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2060, 12, 31), timezones=st.just(UTC)
).map(lambda t: t.replace(microsecond=0))


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(expression=expressions(), start=starts)
def test_our_cron_fires_when_croniter_does(expression: str, start: datetime) -> None:
    ours = fire_times.iter_after(spec.parse("cron", expression, "UTC"), start)
    theirs = croniter(expression, start)
    for _ in range(FIRES):
        expected = theirs.get_next(datetime)
        assert next(ours) == expected, expression


def test_the_day_fields_are_or_when_both_are_restricted() -> None:
    # 13th of the month OR a Friday: croniter and classic cron agree; so must we.
    start = datetime(2026, 3, 1, tzinfo=UTC)
    ours = fire_times.preview(spec.parse("cron", "0 0 13 * 5", "UTC"), start, 4)
    theirs = croniter("0 0 13 * 5", start)
    assert ours == [theirs.get_next(datetime) for _ in range(4)]
    assert ours[0] == datetime(2026, 3, 6, tzinfo=UTC)  # a Friday before the 13th
    assert datetime(2026, 3, 13, tzinfo=UTC) in ours  # the 13th (also a Friday)
    assert all(t - start < timedelta(days=31) for t in ours)
