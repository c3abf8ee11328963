"""Schedule expressions in words: the common shapes read naturally, anything else falls back
to the expression as written, and nothing makes the describer raise."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptsched.console import timefmt
from promptsched.human import describe
from promptsched.schedule import fire_times, spec

CASES = [
    ("cron", "0 9 * * *", "every day at 09:00"),
    ("cron", "30 7 * * 1-5", "at 07:30 on weekdays (Monday to Friday)"),
    ("cron", "0 0 * * 0,6", "at 00:00 on weekends"),
    ("cron", "0 8 * * MON", "at 08:00 on Monday"),
    ("cron", "0 8 * * 1,3,5", "at 08:00 on Monday, Wednesday and Friday"),
    ("cron", "0 9,17 * * *", "every day at 09:00 and 17:00"),
    ("cron", "*/15 * * * *", "every 15 minutes"),
    ("cron", "* * * * *", "every minute"),
    (
        "cron",
        "*/5 9-17 * * 1-5",
        "every 5 minutes from 09:00 to 17:59, on weekdays (Monday to Friday)",
    ),
    ("cron", "0 * * * *", "every hour, on the hour"),
    ("cron", "15 */2 * * *", "every 2 hours, at minute 15"),
    ("cron", "0 0 1 * *", "at 00:00 on day 1 of the month"),
    ("cron", "0 6 L * *", "at 06:00 on the last day of the month"),
    ("cron", "0 0 1 1,7 *", "at 00:00 on day 1 of the month in January and July"),
    ("cron", "* * * * * *", "every second"),
    ("cron", "*/10 * * * * *", "every 10 seconds"),
    ("cron", "0 * * * * *", "every minute"),
    ("cron", "5 * * * * *", "at second 5 past each minute"),
    ("cron", "15,45 * * * * *", "at seconds 15 and 45 past each minute"),
    ("cron", "0 15,45 * * * *", "at minutes 15 and 45 past each hour"),
    ("cron", "0,30 * * * *", "at minutes 0 and 30 past each hour"),
    ("cron", "30 0 9 * * *", "every day at 09:00:30"),
    ("cron", "@daily", "every day at 00:00"),
    ("cron", "@hourly", "every hour, on the hour"),
    ("every", "15m", "every 15 minutes"),
    ("every", "1h", "every hour"),
    ("every", "90s from 2026-03-02T09:00:00Z", "every 90 seconds from 2026-03-02T09:00:00Z"),
    ("at", "2026-12-01T09:00:00Z", "once, on Tue 01 Dec 2026 at 09:00"),
    ("rrule", "FREQ=DAILY;BYHOUR=9", "every day at 09:00"),
]
FALLBACKS = [
    ("cron", "0 9 1 * 1"),  # both day fields: either matches, too subtle for words
    ("cron", "0 9 * * 1#2"),
    ("cron", "1-5/2 3 * * *"),
    ("rrule", "BYDAY=MO"),
    ("every", "soon"),
    ("at", "not a date"),
    ("nonsense", "x"),
]


@pytest.mark.parametrize(("kind", "expression", "words"), CASES, ids=[c[1] for c in CASES])
def test_common_shapes_read_as_words(kind: str, expression: str, words: str) -> None:
    assert describe.describe(kind, expression) == words


@pytest.mark.parametrize(("kind", "expression"), FALLBACKS, ids=[f[1] for f in FALLBACKS])
def test_anything_else_is_shown_as_written(kind: str, expression: str) -> None:
    assert describe.describe(kind, expression) == expression


@given(st.sampled_from(["cron", "every", "at", "rrule"]), st.text(max_size=60))
def test_the_describer_never_raises(kind: str, expression: str) -> None:
    assert describe.describe(kind, expression) or expression == ""


@given(
    st.lists(
        st.sampled_from(["*", "0", "5", "*/3", "1-5", "1,2", "L", "MON", "99", "?"]),
        min_size=5,
        max_size=6,
    )
)
def test_cron_shaped_garbage_never_raises(fields: list[str]) -> None:
    assert describe.describe("cron", " ".join(fields))


def test_relative_times() -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 3, 2, 9, tzinfo=UTC)
    assert timefmt.relative(now + timedelta(hours=3, minutes=5), now) == "in 3 h"
    assert timefmt.relative(now - timedelta(minutes=5), now) == "5 min ago"
    assert timefmt.relative(now, now) == "just now"
    assert timefmt.relative(now + timedelta(days=2), now) == "in 2 d"


NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _fires(rule: str, count: int = 8) -> tuple[str, list[datetime]]:
    parsed = spec.parse("rrule", rule, "UTC")
    return describe.describe("rrule", parsed.expression), fire_times.preview(parsed, NOW, count)


# Each sentence with a check that every previewed fire time agrees with it.
RRULES = [
    ("FREQ=DAILY;BYHOUR=9;BYMINUTE=0", "every day at 09:00",
     lambda ts: {(t.hour, t.minute) for t in ts} == {(9, 0)}
     and all(b - a == timedelta(days=1) for a, b in zip(ts, ts[1:], strict=False))),
    ("FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30",
     "every week on Monday and Wednesday at 09:30",
     lambda ts: {t.strftime("%a %H:%M") for t in ts} == {"Mon 09:30", "Wed 09:30"}),
    ("FREQ=HOURLY;INTERVAL=2", "every 2 hours",
     lambda ts: all(b - a == timedelta(hours=2) for a, b in zip(ts, ts[1:], strict=False))),
    ("FREQ=MONTHLY;BYMONTHDAY=1;BYHOUR=8;BYMINUTE=0", "every month on day 1 at 08:00",
     lambda ts: {(t.day, t.hour) for t in ts} == {(1, 8)}
     and len({(t.year, t.month) for t in ts}) == len(ts)),
    ("FREQ=YEARLY;BYMONTH=3;BYMONTHDAY=15;BYHOUR=9", "every year on 15 March at 09:00",
     lambda ts: {(t.month, t.day, t.hour) for t in ts} == {(3, 15, 9)}
     and [t.year for t in ts] == list(range(ts[0].year, ts[0].year + len(ts)))),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "words", "check"), RRULES, ids=[r[0] for r in RRULES])
def test_an_rrule_sentence_agrees_with_its_preview(rule: str, words: str, check: object) -> None:
    said, times = _fires(rule)
    assert said == words
    assert callable(check) and check(times), times


SPARSE = [
    # fires on 29 February only when it is a Monday: once in 28 years, mostly
    "FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=0;BYMINUTE=0",
    "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYHOUR=9",  # leap years only: not "every year"
    "FREQ=MONTHLY;BYMONTHDAY=31;BYHOUR=9",  # months with 31 days only
    "FREQ=MONTHLY;BYDAY=1MO;BYHOUR=9",
    "FREQ=DAILY;BYHOUR=9;COUNT=3",
]


@pytest.mark.parametrize("rule", SPARSE)
def test_a_rule_a_sentence_would_misdescribe_is_shown_as_written(rule: str) -> None:
    said, times = _fires(rule, 3)
    assert said == f"RRULE:{rule}"
    assert not said.startswith("every")


def test_the_28_year_rule_is_not_every_minute() -> None:
    said, times = _fires(SPARSE[0], 3)
    assert "every minute" not in said
    assert [t.year for t in times] == [2044, 2072, 2112]
