"""Schedule expressions in words: the common shapes read naturally, anything else falls back
to the expression as written, and nothing makes the describer raise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from promptsched.console import describe, timefmt

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
    ("cron", "5 * * * * *", "at second 5 of every minute"),
    ("cron", "30 0 9 * * *", "every day at 09:00:30"),
    ("cron", "@daily", "every day at 00:00"),
    ("cron", "@hourly", "every hour, on the hour"),
    ("every", "15m", "every 15 minutes"),
    ("every", "1h", "every hour"),
    ("every", "90s from 2026-03-02T09:00:00Z", "every 90 seconds from 2026-03-02T09:00:00Z"),
    ("at", "2026-12-01T09:00:00Z", "once, on Tue 01 Dec 2026 at 09:00"),
    ("rrule", "FREQ=DAILY;BYHOUR=9", "daily (RRULE)"),
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
