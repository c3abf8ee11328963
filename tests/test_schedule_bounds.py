"""Bounded schedule math: a step budget between fire times, nothing outside 1970-2200, and the
parser's edge cases (non-ASCII digits, COUNT on rules that never fire, INTERVAL's limit,
names that are not IANA zones)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from dateutil import rrule as du

from promptsched.errors import ValidationError
from promptsched.ops import inputs
from promptsched.schedule import expand, fire_times, limits, rrule, spec

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
# Feb 29 on a Monday (2044, 2072, 2112, ...), at noon, every other second: dateutil walks
# 43,200 seconds for every day between matches: about a minute of CPU per fire time unbounded.
SPARSE = (
    "DTSTART:20260101T000000\n"
    "RRULE:FREQ=SECONDLY;INTERVAL=2;BYHOUR=12;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO"
)


def test_the_step_budget_is_what_stops_a_pathological_rule() -> None:
    rule = du.rrulestr(SPARSE.split("\n")[1], dtstart=datetime(2026, 1, 1))
    assert isinstance(rule, du.rrule)
    started = time.perf_counter()
    with pytest.raises(expand.Exhausted) as info:
        next(expand.occurrences(rule, budget=limits.SEARCH_BUDGET, last_year=limits.LAST_YEAR))
    assert time.perf_counter() - started < 2
    assert info.value.gap
    # the budget, not the range, ended it: a few days in, decades before the first match
    assert info.value.reached < datetime(2026, 2, 1)
    # twice the budget gets twice as far: the count of steps is what stops it
    with pytest.raises(expand.Exhausted) as more:
        next(expand.occurrences(rule, budget=2 * limits.SEARCH_BUDGET))
    assert more.value.reached > info.value.reached


def test_a_rule_that_fires_too_rarely_for_its_freq_is_rejected_quickly_naming_the_reason() -> None:
    started = time.perf_counter()
    with pytest.raises(ValidationError) as info:
        fire_times.check_fires(spec.parse("rrule", SPARSE), NOW)
    assert time.perf_counter() - started < 2
    assert info.value.field == "expression"
    assert "fires less than once in" in info.value.message
    assert "FREQ=SECONDLY" in info.value.message
    assert f"{limits.SEARCH_BUDGET:,} steps" in info.value.message


def test_the_same_sparse_days_at_a_coarser_freq_are_fine() -> None:
    found = fire_times.preview(
        spec.parse(
            "rrule", "DTSTART:20260101T120000\nRRULE:FREQ=DAILY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO"
        ),
        NOW,
        5,
    )
    assert [t.year for t in found] == [2044, 2072, 2112, 2140, 2168]


@pytest.mark.parametrize(
    "body",
    [
        "FREQ=SECONDLY;BYDAY=MO;BYHOUR=12;BYMINUTE=0",
        "FREQ=MINUTELY;BYDAY=MO;BYHOUR=9,17;BYMINUTE=0,30",
        "FREQ=SECONDLY;BYDAY=SU;BYHOUR=3;BYMINUTE=15",
        "FREQ=HOURLY;BYMONTHDAY=1,15",
        "FREQ=SECONDLY;BYSETPOS=1;BYMONTH=1;BYMINUTE=7;BYSECOND=5,6",
        "FREQ=MINUTELY;BYYEARDAY=20,-1;BYHOUR=23;WKST=SU",
    ],
)
def test_a_sub_daily_rule_expanded_per_day_has_exactly_dateutils_occurrences(body: str) -> None:
    start, end = datetime(2026, 1, 1, 7, 3, 11), datetime(2026, 2, 10)
    compiled = rrule.compile_rrule(f"DTSTART:{start:%Y%m%dT%H%M%S}\nRRULE:{body}", UTC)
    assert compiled.rule._freq == du.DAILY  # type: ignore[attr-defined]  # expanded per day
    ours = list(rrule.bounded(compiled.rule.replace(until=end)))
    theirs = list(du.rrulestr(f"RRULE:{body}", dtstart=start).between(start, end, inc=True))
    assert ours == theirs
    assert ours  # each of them fires in the span


def test_nothing_is_returned_past_2200() -> None:
    yearly = spec.parse("cron", "0 0 29 2 *")
    found = fire_times.preview(yearly, datetime(2180, 1, 1, tzinfo=UTC), 100)
    assert found and max(found) < limits.LATEST
    assert len(found) == 5  # 2184 .. 2196 (2200 is no leap year, and out of range anyway)
    daily = spec.parse("rrule", "RRULE:FREQ=DAILY")
    assert fire_times.next_after(daily, datetime(2199, 12, 31, 12, tzinfo=UTC)) is None
    every = spec.parse("every", "1h from 2199-12-31T22:00:00Z")
    assert fire_times.preview(every, NOW, 10) == [
        datetime(2199, 12, 31, 22, tzinfo=UTC),
        datetime(2199, 12, 31, 23, tzinfo=UTC),
    ]


@pytest.mark.parametrize(
    ("kind", "expression", "words"),
    [
        ("rrule", "DTSTART:46920101T000000\nRRULE:FREQ=DAILY", "never fires between"),
        ("at", "4692-01-01T00:00", "after the supported range"),
        ("every", "1h from 2500-01-01T00:00:00Z", "never fires between"),
        (
            "rrule",
            "DTSTART:20260101T000000\nRRULE:FREQ=YEARLY;INTERVAL=400;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
            "never fires",
        ),
    ],
)
def test_far_future_schedules_are_rejected_at_save_time(
    kind: str, expression: str, words: str
) -> None:
    with pytest.raises(ValidationError) as info:
        fire_times.check_fires(spec.parse(kind, expression), NOW)
    assert info.value.field == "expression"
    assert words in info.value.message
    assert "2200-01-01" in info.value.message or "2200" in info.value.message


@pytest.mark.parametrize(
    "expression",
    [
        "¹ * * * *",  # superscript one: str.isdigit() says yes, int() says no
        "*/² * * * *",
        "0 ٩ * * *",  # Arabic-Indic nine: int() would read it as 9
        "0 0 * * 5#¹",
        "0 0 １ * *",  # fullwidth one
        "0 0 1-٣ * *",
    ],
)
def test_cron_fields_with_non_ascii_digits_are_clear_errors(expression: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec.parse("cron", expression)
    assert info.value.field == "expression"
    assert " field '" in info.value.message  # names the cron field and its text


@pytest.mark.parametrize(
    "expression",
    [
        "RRULE:FREQ=DAILY;INTERVAL=¹",
        "RRULE:FREQ=DAILY;COUNT=٣",
        "RRULE:FREQ=DAILY;BYHOUR=¹",
        "RRULE:FREQ=MONTHLY;BYMONTHDAY=-¹",
        "RRULE:FREQ=MONTHLY;BYDAY=¹MO",
        "DTSTART:٢٠٢٦0101T000000\nRRULE:FREQ=DAILY",
        "RRULE:FREQ=DAILY;UNTIL=２０２６1231",
    ],
)
def test_rrule_parts_with_non_ascii_digits_are_clear_errors(expression: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec.parse("rrule", expression)
    assert info.value.field == "expression"


@pytest.mark.parametrize(
    "body",
    [
        "FREQ=SECONDLY;BYSETPOS=2",  # one occurrence per period: position 2 never exists
        "FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYSETPOS=2,-3",
        "FREQ=MINUTELY;BYSECOND=0,30;BYSETPOS=3",
        "FREQ=YEARLY;INTERVAL=400;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
        "FREQ=MINUTELY;INTERVAL=120;BYHOUR=1",  # even hours only, from midnight
    ],
)
def test_count_on_a_rule_that_never_fires_is_rejected_like_the_rule_without_it(body: str) -> None:
    messages = []
    for text in (
        f"DTSTART:20260101T000000\nRRULE:{body}",
        f"DTSTART:20260101T000000\nRRULE:{body};COUNT=5",
    ):
        started = time.perf_counter()
        with pytest.raises(ValidationError) as info:
            fire_times.check_fires(spec.parse("rrule", text), NOW)
        assert time.perf_counter() - started < 2
        assert info.value.field == "expression"
        assert "never fires" in info.value.message
        messages.append(info.value.message)
    assert len(messages) == 2  # the rule, then the rule with COUNT: both clean 422s


def test_a_bysetpos_a_period_can_hold_is_kept() -> None:
    found = fire_times.preview(
        spec.parse(
            "rrule", "DTSTART:20260101T000000\nRRULE:FREQ=MINUTELY;BYSECOND=0,30;BYSETPOS=2"
        ),
        NOW,
        2,
    )
    assert found == [NOW + timedelta(seconds=30), NOW + timedelta(seconds=90)]


def test_a_huge_count_costs_a_bounded_amount_of_work() -> None:
    started = time.perf_counter()
    with pytest.raises(ValidationError) as info:
        spec.parse(
            "rrule",
            "DTSTART:20260101T000000\nRRULE:FREQ=MINUTELY;INTERVAL=7;COUNT=100000;BYHOUR=12",
        )
    assert time.perf_counter() - started < 3
    assert "COUNT=100000" in info.value.message and "smaller COUNT" in info.value.message


@pytest.mark.parametrize("interval", ["10001", "99999999999999999999"])
def test_interval_above_the_documented_limit_names_it(interval: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec.parse("rrule", f"RRULE:FREQ=DAILY;INTERVAL={interval}")
    assert info.value.field == "expression"
    assert "1 to 10,000" in info.value.message


def test_interval_at_the_limit_is_accepted() -> None:
    parsed = spec.parse("rrule", "DTSTART:20260101T000000\nRRULE:FREQ=SECONDLY;INTERVAL=10000")
    assert fire_times.next_after(parsed, NOW) is not None


@pytest.mark.parametrize(
    "name",
    [
        "",
        " ",
        "localtime",
        "Factory",
        "posixrules",
        "right/UTC",
        "posix/Europe/Paris",
        "Europe/Nowhere",
        "../../etc/passwd",
    ],
)
def test_empty_and_non_iana_zones_are_rejected_naming_timezone(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec.parse("cron", "0 9 * * *", name)
    assert info.value.field == "timezone"
    assert "unknown time zone" in info.value.message


def test_an_empty_timezone_in_a_schedule_is_an_error_not_utc() -> None:
    raw = {"name": "n", "cron": "0 9 * * *", "prompt": "p", "timezone": ""}
    with pytest.raises(ValidationError) as info:
        inputs.validate(raw, providers=("echo",))
    assert info.value.field == "timezone"
    del raw["timezone"]
    assert inputs.validate(raw, providers=("echo",)).timezone == "UTC"
