"""The one rendering people read (promptsched/human): instants in a zone with their distance
from now, spans, values in words, text cut with an ellipsis, states and follow-up checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from promptsched.human import followups, schedules, text, times

NOW = datetime(2026, 11, 23, 7, 57, tzinfo=UTC)


@pytest.mark.parametrize(
    ("delta", "words"),
    [
        (timedelta(0), "now"),
        (timedelta(milliseconds=400), "now"),
        (timedelta(seconds=42), "in 42 s"),
        (timedelta(minutes=3), "in 3 min"),
        (timedelta(minutes=3, seconds=20), "in 3 min"),
        (-timedelta(minutes=5, seconds=20), "5 min ago"),
        (timedelta(hours=2), "in 2 h"),
        (timedelta(hours=22, minutes=40), "in 22 h 40 min"),
        (-timedelta(days=3, hours=1), "3 d 1 h ago"),
        (timedelta(days=3, minutes=5), "in 3 d"),
    ],
)
def test_relative_times_in_words(delta: timedelta, words: str) -> None:
    assert times.relative(NOW + delta, NOW) == words


def test_the_console_says_the_largest_unit_as_its_script_does() -> None:
    assert times.relative(NOW + timedelta(hours=22, minutes=40), NOW, units=1) == "in 22 h"
    assert times.relative(NOW, NOW, units=1, now_word="just now") == "just now"


def test_instants_are_shown_in_the_zone_with_the_distance_from_now() -> None:
    assert times.when("2026-11-23T08:00:00+00:00", "Europe/Paris", NOW) == (
        "2026-11-23 09:00 CET (in 3 min)"
    )
    assert times.when("2026-11-23T07:52:30Z", "America/New_York", NOW) == (
        "2026-11-23 02:52:30 EST (4 min ago)"
    )
    assert times.when(None, "UTC", NOW) == "-"
    assert times.when("2026-11-23T08:00:00Z", "Nowhere/Atlantis", NOW).endswith("UTC (in 3 min)")
    assert times.when("2026-11-23T08:00:00Z", "UTC", NOW, seconds=True) == (
        "2026-11-23 08:00:00 UTC (in 3 min)"
    )


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0.25, "250 ms"), (4.0, "4 s"), (21600.0, "6 h"), (5400.0, "1 h 30 min"), (90061, "1 d 1 h")],
)
def test_spans_in_words(seconds: float, words: str) -> None:
    assert times.span(seconds) == words


def test_values_are_words_not_python_reprs() -> None:
    assert text.words({"latency": "2s", "tools": ["http_get", "fetch"]}) == (
        "latency=2s, tools=http_get, fetch"
    )
    assert text.words(True) == "yes" and text.words(False) == "no"
    assert text.words(None) == "-" and text.words(4.0) == "4" and text.words(0.25) == "0.25"


def test_cut_text_ends_with_an_ellipsis_and_whole_text_does_not() -> None:
    assert text.clip("FREQ=MINUTELY;INTERVAL=2", 22) == "FREQ=MINUTELY;INTERVA…"
    assert len(text.clip("FREQ=MINUTELY;INTERVAL=2", 22)) == 22
    assert text.clip("FREQ=MINUTELY;INTERVAL=2", 24) == "FREQ=MINUTELY;INTERVAL=2"
    assert text.clip("two\nlines", 20) == "two lines"


def test_schedule_states_in_words() -> None:
    at = NOW + timedelta(minutes=3)
    assert schedules.state_words(enabled=True, cursor=at, kind="cron") == "enabled"
    assert schedules.state_words(enabled=True, cursor=None, kind="at") == "done (fired once)"
    assert schedules.state_words(enabled=True, cursor=None, kind="rrule") == (
        "done (no more fire times)"
    )
    assert schedules.state_words(
        enabled=False, cursor=at, kind="cron", paused_until=at, reason="holiday",
        zone="Europe/Paris", now=NOW,
    ) == "paused until 2026-11-23 09:00 CET (in 3 min) (holiday)"  # fmt: skip


def test_a_check_is_said_as_where_the_chain_stands() -> None:
    nxt = datetime(2026, 3, 2, 15, 0, tzinfo=UTC)
    assert followups.check_headline(number=2, max_checks=5, outcome="recheck", next_at=nxt) == (
        "check 2 of 5: not resolved, next check at 2026-03-02 15:00 UTC"
    )
    assert followups.check_headline(number=4, max_checks=5, outcome="done") == (
        "check 4 of 5: resolved"
    )
    assert followups.check_headline(number=5, max_checks=5, outcome="max_checks") == (
        "check 5 of 5: not resolved, and no further check (max checks reached)"
    )
    assert followups.decision_words({"recheck_in": 21600.0}) == "check again in 6 h"
    assert followups.decision_words(None, final=True) == "resolved (no recheck asked)"
