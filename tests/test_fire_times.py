"""Table tests for fire times: one readable case per DST rule, zone oddity and kind."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from promptsched.errors import ValidationError
from promptsched.schedule import fire_times, spec

NY, LONDON, SYDNEY, LORD_HOWE = (
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "Australia/Lord_Howe",
)


def at(text: str) -> datetime:
    """An ISO instant with its offset (the expected values read as local wall time)."""
    value = datetime.fromisoformat(text)
    assert value.tzinfo is not None, text
    return value


def case(
    kind: str,
    expression: str,
    zone: str,
    after: str,
    expected: list[str],
    *,
    id: str,
    **kw: str,
) -> Any:
    return pytest.param(kind, expression, zone, kw, after, expected, id=id)


CASES = [
    # --- spring forward: a local time that does not exist ---
    case(
        "cron",
        "30 2 * * *",
        NY,
        "2026-03-07T12:00-05:00",
        ["2026-03-08T03:00-04:00", "2026-03-09T02:30-04:00"],
        id="ny-spring-forward-0230-shifts-to-0300",
    ),
    case(
        "cron",
        "30 2 * * *",
        NY,
        "2026-03-07T12:00-05:00",
        ["2026-03-09T02:30-04:00", "2026-03-10T02:30-04:00"],
        id="ny-spring-forward-dst-gap-skip-fires-nothing",
        dst_gap="skip",
    ),
    case(
        "cron",
        "*/20 2 * * *",
        NY,
        "2026-03-07T12:00-05:00",
        ["2026-03-08T03:00-04:00", "2026-03-09T02:00-04:00"],
        id="ny-spring-forward-three-lost-times-fire-once",
    ),
    case(
        "cron",
        "0,30 2,3 * * *",
        NY,
        "2026-03-07T12:00-05:00",
        ["2026-03-08T03:00-04:00", "2026-03-08T03:30-04:00", "2026-03-09T02:00-04:00"],
        id="ny-spring-forward-shifted-and-0300-are-one-fire",
    ),
    case(
        "cron",
        "30 * * * *",
        NY,
        "2026-03-08T00:00-05:00",
        ["2026-03-08T00:30-05:00", "2026-03-08T01:30-05:00", "2026-03-08T03:30-04:00"],
        id="ny-spring-forward-hour-star-nothing-extra",
    ),
    # --- fall back: a local time that happens twice ---
    case(
        "cron",
        "30 1 * * *",
        NY,
        "2026-10-31T12:00-04:00",
        ["2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"],
        id="ny-fall-back-fixed-hour-fires-first-occurrence-only",
    ),
    case(
        "cron",
        "30 1 * * *",
        NY,
        "2026-10-31T12:00-04:00",
        ["2026-11-01T01:30-04:00", "2026-11-01T01:30-05:00", "2026-11-02T01:30-05:00"],
        id="ny-fall-back-dst-fold-both-fires-twice",
        dst_fold="both",
    ),
    case(
        "cron",
        "30 * * * *",
        NY,
        "2026-11-01T00:00-04:00",
        [
            "2026-11-01T00:30-04:00",
            "2026-11-01T01:30-04:00",
            "2026-11-01T01:30-05:00",
            "2026-11-01T02:30-05:00",
        ],
        id="ny-fall-back-hour-star-follows-real-time",
    ),
    case(
        "cron",
        "45 1 * * *",
        NY,
        "2026-11-01T01:20-05:00",
        ["2026-11-02T01:45-05:00"],
        id="ny-after-inside-second-pass-does-not-refire",
    ),
    case(
        "cron",
        "45 1 * * *",
        NY,
        "2026-11-01T01:20-05:00",
        ["2026-11-01T01:45-05:00", "2026-11-02T01:45-05:00"],
        id="ny-after-inside-second-pass-fold-both",
        dst_fold="both",
    ),
    case(
        "cron",
        "0 1-3 * * *",
        LONDON,
        "2026-10-24T12:00+01:00",
        ["2026-10-25T01:00+01:00", "2026-10-25T02:00+00:00", "2026-10-25T03:00+00:00"],
        id="london-fall-back-hour-range-is-not-star",
    ),
    # --- 30-minute shifts ---
    case(
        "cron",
        "15 2 * * *",
        LORD_HOWE,
        "2026-10-03T12:00+10:30",
        ["2026-10-04T02:30+11:00", "2026-10-05T02:15+11:00"],
        id="lord-howe-spring-forward-0215-shifts-to-0230",
    ),
    case(
        "cron",
        "45 1 * * *",
        LORD_HOWE,
        "2026-04-04T12:00+11:00",
        ["2026-04-05T01:45+11:00", "2026-04-06T01:45+10:30"],
        id="lord-howe-fall-back-half-hour-fires-once",
    ),
    case(
        "cron",
        "45 1 * * *",
        LORD_HOWE,
        "2026-04-04T12:00+11:00",
        ["2026-04-05T01:45+11:00", "2026-04-05T01:45+10:30", "2026-04-06T01:45+10:30"],
        id="lord-howe-fall-back-half-hour-fold-both",
        dst_fold="both",
    ),
    # --- transitions at midnight ---
    case(
        "cron",
        "0 0 * * *",
        "America/Sao_Paulo",
        "2018-11-03T12:00-03:00",
        ["2018-11-04T01:00-02:00", "2018-11-05T00:00-02:00"],
        id="sao-paulo-2018-midnight-gap-shifts-to-0100",
    ),
    case(
        "cron",
        "30 23 * * *",
        "America/Sao_Paulo",
        "2019-02-16T12:00-02:00",
        ["2019-02-16T23:30-02:00", "2019-02-17T23:30-03:00"],
        id="sao-paulo-2019-repeated-2330-fires-once",
    ),
    case(
        "cron",
        "30 0 * * *",
        "America/Havana",
        "2026-03-07T12:00-05:00",
        ["2026-03-08T01:00-04:00", "2026-03-09T00:30-04:00"],
        id="havana-midnight-gap-0030-shifts-to-0100",
    ),
    case(
        "cron",
        "30 23 * * *",
        "Asia/Beirut",
        "2026-10-24T12:00+03:00",
        ["2026-10-24T23:30+03:00", "2026-10-25T23:30+02:00"],
        id="beirut-midnight-fold-2330-fires-once",
    ),
    # --- southern hemisphere ---
    case(
        "cron",
        "30 2 * * *",
        SYDNEY,
        "2026-10-03T12:00+10:00",
        ["2026-10-04T03:00+11:00", "2026-10-05T02:30+11:00"],
        id="sydney-october-spring-forward-shifts",
    ),
    case(
        "cron",
        "30 2 * * *",
        SYDNEY,
        "2026-04-04T12:00+11:00",
        ["2026-04-05T02:30+11:00", "2026-04-06T02:30+10:00"],
        id="sydney-april-fall-back-fires-once",
    ),
    # --- calendar corners ---
    case(
        "cron",
        "0 12 29 2 *",
        "UTC",
        "2026-01-01T00:00Z",
        ["2028-02-29T12:00Z", "2032-02-29T12:00Z"],
        id="cron-feb-29-waits-for-leap-years",
    ),
    case(
        "cron",
        "0 0 13 * 5",
        "UTC",
        "2026-02-01T00:00Z",
        ["2026-02-06T00:00Z", "2026-02-13T00:00Z", "2026-02-20T00:00Z"],
        id="cron-day-of-month-or-day-of-week",
    ),
    case(
        "cron",
        "0 9 * * 1#2",
        "UTC",
        "2026-01-01T00:00Z",
        ["2026-01-12T09:00Z", "2026-02-09T09:00Z"],
        id="cron-second-monday",
    ),
    case(
        "cron",
        "0 9 * * 5L",
        "UTC",
        "2026-01-01T00:00Z",
        ["2026-01-30T09:00Z", "2026-02-27T09:00Z"],
        id="cron-last-friday",
    ),
    case(
        "cron",
        "0 0 L * *",
        "UTC",
        "2026-01-15T00:00Z",
        ["2026-01-31T00:00Z", "2026-02-28T00:00Z", "2026-03-31T00:00Z"],
        id="cron-last-day-of-month",
    ),
    # --- six fields: seconds first ---
    case(
        "cron",
        "30 0 9 * * *",
        "UTC",
        "2026-01-01T00:00Z",
        ["2026-01-01T09:00:30Z", "2026-01-02T09:00:30Z"],
        id="six-fields-seconds-first",
    ),
    case(
        "cron",
        "*/15 * * * * *",
        "UTC",
        "2026-01-01T00:00:05Z",
        ["2026-01-01T00:00:15Z", "2026-01-01T00:00:30Z", "2026-01-01T00:00:45Z"],
        id="six-fields-every-fifteen-seconds",
    ),
    case(
        "cron",
        "10 30 2 * * *",
        NY,
        "2026-03-07T12:00-05:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:10-04:00"],
        id="six-fields-spring-forward-shifts-to-gap-end",
    ),
    # --- macros ---
    case(
        "cron",
        "@hourly",
        "UTC",
        "2026-01-01T00:10Z",
        ["2026-01-01T01:00Z", "2026-01-01T02:00Z"],
        id="macro-hourly",
    ),
    case(
        "cron", "@daily", NY, "2026-01-01T00:10-05:00", ["2026-01-02T00:00-05:00"], id="macro-daily"
    ),
    case(
        "cron",
        "@weekly",
        "UTC",
        "2026-01-01T00:00Z",
        ["2026-01-04T00:00Z"],
        id="macro-weekly-is-sunday",
    ),
    case("cron", "@monthly", "UTC", "2026-01-01T00:00Z", ["2026-02-01T00:00Z"], id="macro-monthly"),
    case(
        "cron", "@annually", "UTC", "2026-01-01T00:00Z", ["2027-01-01T00:00Z"], id="macro-annually"
    ),
    # --- RRULE ---
    case(
        "rrule",
        "DTSTART:20260101T090000\nRRULE:FREQ=MONTHLY;BYMONTHDAY=-1",
        "Europe/Paris",
        "2026-01-01T00:00+01:00",
        ["2026-01-31T09:00+01:00", "2026-02-28T09:00+01:00", "2026-03-31T09:00+02:00"],
        id="rrule-last-day-of-month",
    ),
    case(
        "rrule",
        "DTSTART:20240229T090000\nRRULE:FREQ=YEARLY",
        "Europe/Berlin",
        "2024-03-01T00:00+01:00",
        ["2028-02-29T09:00+01:00"],
        id="rrule-feb-29-yearly-skips-common-years",
    ),
    case(
        "rrule",
        "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;COUNT=3",
        NY,
        "2025-12-31T00:00-05:00",
        ["2026-01-01T09:00-05:00", "2026-01-02T09:00-05:00", "2026-01-03T09:00-05:00"],
        id="rrule-count-ends-the-schedule",
    ),
    case(
        "rrule",
        "DTSTART:20260101T090000\nRRULE:FREQ=DAILY;UNTIL=20260102T140000Z",
        NY,
        "2025-12-31T00:00-05:00",
        ["2026-01-01T09:00-05:00", "2026-01-02T09:00-05:00"],
        id="rrule-until-utc-is-inclusive-and-ends",
    ),
    case(
        "rrule",
        "DTSTART:20260301T023000\nRRULE:FREQ=DAILY",
        NY,
        "2026-03-07T12:00-05:00",
        ["2026-03-08T03:00-04:00", "2026-03-09T02:30-04:00"],
        id="rrule-daily-spring-forward-shifts",
    ),
    case(
        "rrule",
        "DTSTART:20260301T013000\nRRULE:FREQ=DAILY",
        NY,
        "2026-10-31T12:00-04:00",
        ["2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"],
        id="rrule-daily-fall-back-fires-once",
    ),
    case(
        "rrule",
        "DTSTART:20260101T000000\nRRULE:FREQ=HOURLY",
        NY,
        "2026-11-01T00:30-04:00",
        ["2026-11-01T01:00-04:00", "2026-11-01T01:00-05:00", "2026-11-01T02:00-05:00"],
        id="rrule-hourly-follows-real-time-on-fall-back",
    ),
    case(
        "rrule",
        "DTSTART:20260101T000000\nRRULE:FREQ=HOURLY;BYHOUR=1,2",
        NY,
        "2026-11-01T00:30-04:00",
        ["2026-11-01T01:00-04:00", "2026-11-01T02:00-05:00", "2026-11-02T01:00-05:00"],
        id="rrule-hourly-with-byhour-fires-once",
    ),
    case(
        "rrule",
        "DTSTART:19700101T000000\nRRULE:FREQ=MINUTELY;INTERVAL=7",
        "UTC",
        "2026-01-01T00:00Z",
        ["2026-01-01T00:07Z", "2026-01-01T00:14Z"],
        id="rrule-minutely-keeps-phase-from-1970",
    ),
    # --- every: elapsed real time, DST ignored ---
    case(
        "every",
        "15m",
        NY,
        "2026-11-01T01:40-04:00",
        ["2026-11-01T01:45-04:00", "2026-11-01T01:00-05:00", "2026-11-01T01:15-05:00"],
        id="every-15m-across-fall-back-counts-real-time",
    ),
    case(
        "every",
        "90s",
        "UTC",
        "2026-01-01T00:00:10Z",
        ["2026-01-01T00:01:30Z", "2026-01-01T00:03:00Z"],
        id="every-90s-aligned-to-unix-epoch",
    ),
    case(
        "every",
        "1h from 2026-01-01T00:07:00Z",
        "UTC",
        "2025-06-01T00:00Z",
        ["2026-01-01T00:07Z", "2026-01-01T01:07Z"],
        id="every-with-anchor-starts-at-anchor",
    ),
    # --- at ---
    case(
        "at",
        "2026-03-08T02:30-05:00",
        NY,
        "2026-01-01T00:00Z",
        ["2026-03-08T03:30-04:00"],
        id="at-in-gap-accepted-with-offset",
    ),
    case(
        "at",
        "2026-11-01T01:30-05:00",
        NY,
        "2026-01-01T00:00Z",
        ["2026-11-01T01:30-05:00"],
        id="at-in-fold-accepted-with-offset-picks-second",
    ),
    case(
        "at",
        "2026-12-01T09:00",
        "Europe/Paris",
        "2026-12-01T08:00Z",
        [],
        id="at-already-past-has-no-fire",
    ),
]


@pytest.mark.parametrize(("kind", "expression", "zone", "kw", "after", "expected"), CASES)
def test_fire_times(
    kind: str, expression: str, zone: str, kw: dict[str, str], after: str, expected: list[str]
) -> None:
    s = spec.parse(kind, expression, zone, **kw)
    got = fire_times.preview(s, at(after), len(expected) + 1)
    assert got[: len(expected)] == [at(e) for e in expected]
    assert all(t.tzinfo is UTC for t in got)
    if kind in ("rrule", "at") and len(got) == len(expected):
        return  # the schedule ended: nothing more
    assert len(got) == len(expected) + 1


@pytest.mark.parametrize(
    ("expression", "zone", "kw", "start", "end", "count"),
    [
        pytest.param(
            "30 1 * * *",
            NY,
            {},
            "2026-11-01T00:00-04:00",
            "2026-11-30T23:59-05:00",
            30,
            id="november-fixed-hour-fires-30-times",
        ),
        pytest.param(
            "30 1 * * *",
            NY,
            {"dst_fold": "both"},
            "2026-11-01T00:00-04:00",
            "2026-11-30T23:59-05:00",
            31,
            id="november-fold-both-fires-31-times",
        ),
        pytest.param(
            "30 2 * * *",
            NY,
            {},
            "2026-03-01T00:00-05:00",
            "2026-03-31T23:59-04:00",
            31,
            id="march-gap-shift-keeps-31",
        ),
        pytest.param(
            "30 2 * * *",
            NY,
            {"dst_gap": "skip"},
            "2026-03-01T00:00-05:00",
            "2026-03-31T23:59-04:00",
            30,
            id="march-gap-skip-loses-one",
        ),
        pytest.param(
            "30 * * * *",
            NY,
            {},
            "2026-11-01T00:00-04:00",
            "2026-11-01T23:59-05:00",
            25,
            id="fall-back-day-has-25-hours",
        ),
        pytest.param(
            "30 * * * *",
            NY,
            {},
            "2026-03-08T00:00-05:00",
            "2026-03-08T23:59-04:00",
            23,
            id="spring-forward-day-has-23-hours",
        ),
        pytest.param(
            "*/20 2 * * *",
            NY,
            {},
            "2026-03-08T00:00-05:00",
            "2026-03-08T23:59-04:00",
            1,
            id="spring-forward-gap-counts-once",
        ),
        pytest.param(
            "0,30 2,3 * * *",
            NY,
            {},
            "2026-03-08T00:00-05:00",
            "2026-03-08T23:59-04:00",
            2,
            id="spring-forward-shift-dedupes-in-counts",
        ),
        pytest.param(
            "45 1 * * *",
            NY,
            {},
            "2026-11-01T01:50-05:00",
            "2026-11-02T23:00-05:00",
            1,
            id="count-from-second-pass-skips-refire",
        ),
    ],
)
def test_count_between_across_dst(
    expression: str, zone: str, kw: dict[str, str], start: str, end: str, count: int
) -> None:
    s = spec.parse("cron", expression, zone, **kw)
    assert fire_times.count_between(s, at(start), at(end), limit=1000) == (count, True)
    walked = 0
    for t in fire_times.iter_after(s, at(start) - timedelta(microseconds=1)):
        if t > at(end):
            break
        walked += 1
    assert walked == count


def test_count_between_week_of_minutes_is_closed_form() -> None:
    s = spec.parse("cron", "* * * * *", NY)
    start = at("2026-03-05T00:00-05:00")  # the week holds a spring-forward gap: real time
    end = start + timedelta(days=7) - timedelta(seconds=1)
    assert fire_times.count_between(s, start, end, limit=10**6) == (7 * 1440, True)
    assert fire_times.count_between(s, start, end, limit=100) == (100, False)


def test_count_between_every_and_at() -> None:
    every = spec.parse("every", "1h")
    start = at("2026-01-01T00:00Z")
    assert fire_times.count_between(every, start, start + timedelta(days=365), limit=10**6) == (
        365 * 24 + 1,
        True,
    )
    one = spec.parse("at", "2026-01-01T00:00Z")
    assert fire_times.count_between(one, start, start, limit=5) == (1, True)
    assert fire_times.count_between(one, start + timedelta(seconds=1), start, limit=5) == (0, True)


def test_last_between_lists_the_latest_slots() -> None:
    s = spec.parse("cron", "*/10 * * * *")
    start, end = at("2026-01-01T00:00Z"), at("2026-01-31T00:05Z")
    assert fire_times.last_between(s, start, end, 3) == [
        at("2026-01-30T23:40Z"),
        at("2026-01-30T23:50Z"),
        at("2026-01-31T00:00Z"),
    ]
    assert fire_times.last_between(s, start, start + timedelta(minutes=15), 5) == [
        at("2026-01-01T00:00Z"),
        at("2026-01-01T00:10Z"),
    ]


def test_next_after_requires_an_aware_instant() -> None:
    with pytest.raises(ValueError, match="aware"):
        fire_times.next_after(spec.parse("cron", "* * * * *"), datetime(2026, 1, 1))


def test_next_after_accepts_any_zone_and_returns_utc() -> None:
    s = spec.parse("cron", "0 9 * * *", "Asia/Kolkata")
    got = fire_times.next_after(s, at("2026-01-01T00:00-08:00"))
    assert got == at("2026-01-02T09:00+05:30")
    assert getattr(got, "tzinfo", None) is UTC


@pytest.mark.parametrize(
    ("expression", "zone", "problem"),
    [
        pytest.param("2026-03-08T02:30", NY, "does not exist", id="at-in-gap-rejected"),
        pytest.param("2026-11-01T01:30", NY, "happens twice", id="at-in-fold-rejected"),
        pytest.param("2026-10-04T02:15", LORD_HOWE, "does not exist", id="at-lord-howe-gap"),
        pytest.param(
            "2018-11-04T00:30",
            "America/Sao_Paulo",
            "does not exist",
            id="at-sao-paulo-midnight-gap",
        ),
    ],
)
def test_at_in_gap_or_fold_without_offset_is_rejected(
    expression: str, zone: str, problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem) as info:
        spec.parse("at", expression, zone)
    assert info.value.field == "expression"
    assert "UTC offset" in info.value.message


def test_fire_times_are_deterministic_for_caching() -> None:
    s = spec.parse("cron", "*/7 * * * *", LONDON)
    after = at("2026-03-29T00:30Z")
    assert fire_times.preview(s, after, 20) == fire_times.preview(
        spec.parse("cron", "*/7  *  * * *", LONDON), after, 20
    )
    assert hash(s) == hash(spec.parse("cron", "*/7 * * * *", LONDON))


def test_local_aware_instants_are_read_as_instants_not_wall_clock() -> None:
    """`local + timedelta` is wall-clock arithmetic in Python; inputs in a zone must not drift."""
    ny = spec.load_zone(NY)
    s = spec.parse("cron", "0 * * * *", NY)
    second_pass = datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=ny)  # 01:30 EST = 06:30Z
    end = datetime(2026, 11, 1, 3, 0, tzinfo=ny)
    assert fire_times.next_after(s, second_pass) == at("2026-11-01T07:00Z")
    assert fire_times.last_between(s, second_pass, end, 5) == [
        at("2026-11-01T07:00Z"),
        at("2026-11-01T08:00Z"),
    ]
    assert fire_times.count_between(s, second_pass, end, limit=10) == (2, True)
