"""Schedule specs: parse errors name the field and the problem; kinds are detected from text."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptsched.errors import ValidationError
from promptsched.schedule import fire_times, spec

NOW = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "expression", "kw", "field", "problem"),
    [
        pytest.param("weekly", "x", {}, "kind", "unknown schedule kind", id="unknown-kind"),
        pytest.param(
            "cron",
            "* * * * *",
            {"timezone": "Mars/Base"},
            "timezone",
            "unknown time zone 'Mars/Base'",
            id="unknown-zone",
        ),
        pytest.param(
            "cron",
            "* * * * *",
            {"timezone": "America/New_Yrok"},
            "timezone",
            "did you mean 'America/New_York'",
            id="zone-typo-suggests",
        ),
        pytest.param(
            "cron", "* * * * *", {"timezone": ""}, "timezone", "unknown time zone", id="empty-zone"
        ),
        pytest.param(
            "cron",
            "* * * * *",
            {"dst_gap": "later"},
            "dst_gap",
            "'shift' or 'skip'",
            id="bad-dst-gap",
        ),
        pytest.param(
            "cron",
            "* * * * *",
            {"dst_fold": "last"},
            "dst_fold",
            "'first' or 'both'",
            id="bad-dst-fold",
        ),
        pytest.param("cron", "  ", {}, "expression", "expression is required", id="empty"),
        pytest.param(
            "cron",
            "61 * * * *",
            {},
            "expression",
            "minute field '61': 61 is out of range 0-59",
            id="minute-out-of-range",
        ),
        pytest.param("cron", "0 24 * * *", {}, "expression", "hour field '24'", id="hour-24"),
        pytest.param(
            "cron", "0 0 0 * *", {}, "expression", "day-of-month field '0'", id="day-zero"
        ),
        pytest.param("cron", "0 0 * 13 *", {}, "expression", "out of range 1-12", id="month-13"),
        pytest.param("cron", "0 0 * * 8", {}, "expression", "out of range 0-7", id="weekday-8"),
        pytest.param(
            "cron",
            "61 0 0 * * *",
            {},
            "expression",
            "second field '61'",
            id="six-fields-seconds-first-range",
        ),
        pytest.param("cron", "* * *", {}, "expression", "5 fields", id="too-few-fields"),
        pytest.param("cron", "0 0 0 1 1 * 2026", {}, "expression", "got 7", id="seven-fields"),
        pytest.param(
            "cron", "*/0 * * * *", {}, "expression", "step '0' must be a number > 0", id="step-zero"
        ),
        pytest.param("cron", "5-1 * * * *", {}, "expression", "runs backwards", id="range-back"),
        pytest.param(
            "cron", "x * * * *", {}, "expression", "'x' is not a number or name", id="garbage"
        ),
        pytest.param(
            "cron", "0 0 * foo *", {}, "expression", "month field 'foo'", id="bad-month-name"
        ),
        pytest.param(
            "cron",
            "? * * * *",
            {},
            "expression",
            "only allowed in the day fields",
            id="question-mark-in-minute",
        ),
        pytest.param("cron", "0 0 * * mon#6", {}, "expression", "#1 to #5", id="nth-six"),
        pytest.param(
            "cron", "0 0 15W * *", {}, "expression", "'W' is not supported", id="nearest-weekday"
        ),
        pytest.param(
            "cron", "@fortnightly", {}, "expression", "unknown cron macro", id="unknown-macro"
        ),
        pytest.param("cron", "0 0 30 2 *", {}, "expression", "never fires", id="feb-30"),
        pytest.param(
            "cron",
            "0 0 31 4,6,9,11 *",
            {},
            "expression",
            "never fires",
            id="day-31-in-30-day-months",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=FORTNIGHTLY",
            {},
            "expression",
            "invalid RRULE",
            id="rrule-bad-freq",
        ),
        pytest.param("rrule", "RRULE:BYHOUR=9", {}, "expression", "needs FREQ", id="rrule-no-freq"),
        pytest.param(
            "rrule",
            "RRULE:FREQ=DAILY;BYHOUR=25",
            {},
            "expression",
            "BYHOUR=25: '25' must be 0..23",
            id="rrule-hour-25",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=HOURLY;BYHOUR=99",
            {},
            "expression",
            "BYHOUR=99",
            id="rrule-hourly-hour-99",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=MONTHLY;BYMONTHDAY=0",
            {},
            "expression",
            "must be 1..31 or -31..-1",
            id="rrule-monthday-zero",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=DAILY;INTERVAL=0",
            {},
            "expression",
            "INTERVAL",
            id="rrule-interval-zero",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=DAILY;COUNT=3;UNTIL=20270101",
            {},
            "expression",
            "COUNT or UNTIL, not both",
            id="rrule-count-and-until",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=DAILY;COUNT=0",
            {},
            "expression",
            "COUNT=0 must be between",
            id="rrule-count-zero",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=DAILY;UNTIL=tomorrow",
            {},
            "expression",
            "UNTIL=TOMORROW is not a date",
            id="rrule-bad-until",
        ),
        pytest.param(
            "rrule",
            "DTSTART;TZID=Europe/Paris:20260101T090000\nRRULE:FREQ=DAILY",
            {},
            "expression",
            "TZID=Europe/Paris but the schedule's timezone is UTC",
            id="rrule-tzid-mismatch",
        ),
        pytest.param(
            "rrule",
            "DTSTART:2026-01-01\nRRULE:FREQ=DAILY",
            {},
            "expression",
            "is not a DTSTART like",
            id="rrule-bad-dtstart",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=DAILY\nEXDATE:20260102T090000",
            {},
            "expression",
            "unexpected 'EXDATE",
            id="rrule-extra-line",
        ),
        pytest.param(
            "rrule",
            "RRULE:FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30",
            {},
            "expression",
            "never fires",
            id="rrule-feb-30",
        ),
        pytest.param("at", "tomorrow", {}, "expression", "not an ISO date-time", id="at-not-iso"),
        pytest.param("every", "soon", {}, "expression", "not a duration", id="every-garbage"),
        pytest.param(
            "every", "500ms", {}, "expression", "whole number of seconds", id="every-sub-second"
        ),
        pytest.param("every", "0s", {}, "expression", "seconds >= 1s, not '0s'", id="every-zero"),
        pytest.param(
            "every",
            "5m from yesterday",
            {},
            "expression",
            "not an ISO date-time",
            id="every-bad-anchor",
        ),
    ],
)
def test_parse_errors_name_field_and_problem(
    kind: str, expression: str, kw: dict[str, str], field: str, problem: str
) -> None:
    options = {k: v for k, v in kw.items() if k != "timezone"}
    with pytest.raises(ValidationError) as info:
        spec.parse(kind, expression, kw.get("timezone", "UTC"), **options)
    assert info.value.field == field
    assert problem in info.value.message
    assert "Traceback" not in info.value.message


@pytest.mark.parametrize(
    ("text", "kind", "expression"),
    [
        pytest.param("every 15m", "every", "15m", id="every"),
        pytest.param("Every 1h30m", "every", "90m", id="every-compound-duration"),
        pytest.param(
            "every 15m from 2026-01-01T00:07:00+00:00",
            "every",
            "15m from 2026-01-01T00:07:00Z",
            id="every-with-anchor",
        ),
        pytest.param("at 2026-12-01T09:00", "at", "2026-12-01T09:00:00", id="at"),
        pytest.param(
            "2026-12-01 09:00+01:00", "at", "2026-12-01T09:00:00+01:00", id="bare-iso-is-at"
        ),
        pytest.param("2026-12-01T09:00Z", "at", "2026-12-01T09:00:00Z", id="at-utc"),
        pytest.param(
            "RRULE:FREQ=DAILY;BYHOUR=9",
            "rrule",
            "DTSTART:19700101T000000\nRRULE:FREQ=DAILY;BYHOUR=9",
            id="rrule-no-dtstart",
        ),
        pytest.param(
            "dtstart;tzid=Europe/Paris:20260101t090000z rrule:freq=daily",
            "rrule",
            "DTSTART;TZID=Europe/Paris:20260101T090000Z\nRRULE:FREQ=DAILY",
            id="rrule-lower-case",
        ),
        pytest.param(
            "freq=hourly", "rrule", "DTSTART:19700101T000000\nRRULE:FREQ=HOURLY", id="bare-freq"
        ),
        pytest.param(
            "DTSTART:20260101T090000 RRULE:FREQ=WEEKLY;BYDAY=MO",
            "rrule",
            "DTSTART:20260101T090000\nRRULE:FREQ=WEEKLY;BYDAY=MO",
            id="rrule-one-line",
        ),
        pytest.param(
            "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;COUNT=5",
            "rrule",
            "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;COUNT=5",
            id="rrule-two-lines",
        ),
        pytest.param("@hourly", "cron", "@hourly", id="macro"),
        pytest.param("@ANNUALLY", "cron", "@yearly", id="macro-alias"),
        pytest.param("@midnight", "cron", "@daily", id="macro-midnight"),
        pytest.param(" */5   * * * * ", "cron", "*/5 * * * *", id="cron-whitespace"),
        pytest.param("0 */5 * * * *", "cron", "0 */5 * * * *", id="cron-six-fields"),
        pytest.param("0 9 * * MON-FRI", "cron", "0 9 * * MON-FRI", id="cron-names"),
    ],
)
def test_parse_line_detects_kind(text: str, kind: str, expression: str) -> None:
    s = spec.parse_line(text, "Europe/Paris")
    assert (s.kind, s.expression, s.timezone) == (kind, expression, "Europe/Paris")
    # the canonical text parses to itself, so it is safe to store and re-read
    assert spec.parse(s.kind, s.expression, s.timezone) == s


def test_parse_line_passes_dst_options() -> None:
    s = spec.parse_line("30 2 * * *", "America/New_York", dst_gap="skip", dst_fold="both")
    assert (s.dst_gap, s.dst_fold) == ("skip", "both")


def test_spec_is_frozen_and_hashable() -> None:
    s = spec.parse("cron", "0 9 * * *", "Europe/Paris")
    assert {s: 1}[spec.parse("cron", "0  9 * * *", "Europe/Paris")] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.expression = "x"  # type: ignore[misc]


def test_rrule_dtstart_in_utc_is_read_on_the_schedule_wall_clock() -> None:
    s = spec.parse("rrule", "DTSTART:20260105T140000Z\nRRULE:FREQ=DAILY", "America/New_York")
    assert fire_times.check_fires(s, NOW) == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)  # 09:00 EDT


def test_rrule_dtstart_with_matching_tzid_is_accepted() -> None:
    text = "DTSTART;TZID=America/New_York:20260105T090000\nRRULE:FREQ=DAILY"
    s = spec.parse("rrule", text, "America/New_York")
    assert fire_times.check_fires(s, NOW) == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "expression", "problem"),
    [
        pytest.param(
            "rrule",
            "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;COUNT=10",
            "COUNT or UNTIL is exhausted",
            id="rrule-count-exhausted",
        ),
        pytest.param(
            "rrule",
            "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;UNTIL=20260301",
            "COUNT or UNTIL is exhausted",
            id="rrule-until-passed",
        ),
        pytest.param(
            "cron", "0 0 */30 2 0#5", "no date matches", id="cron-and-day-fields-never-match"
        ),
    ],
)
def test_check_fires_rejects_schedules_that_never_fire(
    kind: str, expression: str, problem: str
) -> None:
    s = spec.parse(kind, expression)
    with pytest.raises(ValidationError, match="never fires") as info:
        fire_times.check_fires(s, NOW)
    assert info.value.field == "expression"
    assert problem in info.value.message


def test_check_fires_says_a_past_at_is_past() -> None:
    s = spec.parse("at", "2026-01-01T09:00", "Europe/Paris")
    with pytest.raises(ValidationError) as info:
        fire_times.check_fires(s, NOW)
    assert (info.value.field, info.value.message) == (
        "at",
        "that time is past (2026-01-01 09:00:00 CET); give one in the future",
    )


def test_check_fires_returns_the_first_fire() -> None:
    s = spec.parse("cron", "0 9 * * *", "Europe/Paris")
    assert fire_times.check_fires(s, NOW) == datetime(2026, 6, 1, 7, 0, tzinfo=UTC)


CRONISH = st.text(alphabet="0123456789*/,-?#LW@ ", max_size=24)
RRULEISH = st.lists(
    st.sampled_from(
        [
            "FREQ=DAILY",
            "FREQ=HOURLY",
            "FREQ=YEARLY",
            "INTERVAL=0",
            "INTERVAL=3",
            "COUNT=2",
            "UNTIL=20260101",
            "UNTIL=2026",
            "BYHOUR=99",
            "BYMONTHDAY=-1",
            "BYMONTH=2",
            "BYMONTHDAY=30",
            "BYDAY=MO",
            "BYDAY=XX",
            "BYSETPOS=1",
            "WKST=SU",
            "X=1",
            "=",
            "",
        ]
    ),
    max_size=5,
).map(lambda parts: "RRULE:" + ";".join(parts))


@settings(max_examples=300, deadline=None, database=None)
@given(text=st.one_of(CRONISH, RRULEISH, st.text(max_size=30)))
def test_parse_line_fails_only_with_validation_errors(text: str) -> None:
    try:
        s = spec.parse_line(text, "America/New_York")
    except ValidationError as exc:
        assert exc.field == "expression" and exc.message
        return
    # whatever parses must also compute fire times without crashing
    fire_times.preview(s, NOW, 3)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("RRULE:FREQ=DAILY;BYMONTH=2;BYYEARDAY=1", id="month-vs-yearday"),
        pytest.param("RRULE:FREQ=MONTHLY;BYDAY=-1FR;BYMONTHDAY=1,2,3", id="last-friday-on-1st"),
        pytest.param(
            "DTSTART:20260106T090000\nRRULE:FREQ=DAILY;INTERVAL=7;BYDAY=MO", id="weekly-phase"
        ),
    ],
)
def test_rrule_contradictions_are_rejected_without_iterating_to_9999(text: str) -> None:
    with pytest.raises(ValidationError, match="the RRULE never fires"):
        spec.parse("rrule", text)


def test_rrule_rare_but_possible_rules_are_accepted() -> None:
    s = spec.parse("rrule", "DTSTART:20260101T090000\nRRULE:FREQ=MONTHLY;BYDAY=5MO;BYMONTH=2")
    assert fire_times.check_fires(s, NOW) == datetime(2044, 2, 29, 9, 0, tzinfo=UTC)
