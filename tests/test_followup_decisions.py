"""How a check's answer is read (executors/decision.py) and where a follow-up's first check
lands (resolution): pure functions, one table each."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from promptsched.executors import decision
from promptsched.ops import followups

NOW = datetime(2026, 3, 2, 9, 7, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("answer", "output", "expected"),
    [
        ({"recheck_in": "6h"}, "", {"recheck_in": 21600.0}),
        ({"recheck_at": "2026-03-03T09:00:00+01:00"}, "",
         {"recheck_at": "2026-03-03T09:00:00+01:00"}),
        ({"output": "shipped"}, "shipped", None),  # a body without recheck_*: done
        (None, '{"recheck_in": "15m", "why": "no tracking yet"}', {"recheck_in": 900.0}),
        # an agent's final output: its last fenced JSON block decides
        (None, 'Not yet.\n```json\n{"recheck_in": "1h"}\n```\n', {"recheck_in": 3600.0}),
        (None, '```json\n{"recheck_in": "1h"}\n```\nthen\n```json\n{"done": true}\n```', None),
        (None, "The order shipped on Monday.", None),
        (None, "{not json", None),
        ({"recheck_in": "soon"}, "", {"error": "recheck_in: not a duration: 'soon' (use e.g. "
                                     "500ms, 30s, 5m, 1h, 1d)", "recheck_in": "soon"}),
        ({"recheck_at": "2026-03-03T09:00:00"}, "",
         {"error": "recheck_at: needs a UTC offset", "recheck_at": "2026-03-03T09:00:00"}),
    ],
)  # fmt: skip
def test_a_checks_answer_is_read_as_a_decision(
    answer: dict[str, str] | None, output: str, expected: dict[str, object] | None
) -> None:
    assert decision.read(answer, output) == expected


def test_resolution_rounds_the_first_check_up_to_its_slot() -> None:
    fifteen = timedelta(minutes=15)
    assert followups._rounded(NOW, fifteen) == datetime(2026, 3, 2, 9, 15, tzinfo=UTC)
    on_slot = datetime(2026, 3, 2, 9, 15, tzinfo=UTC)
    assert followups._rounded(on_slot, fifteen) == on_slot  # already on a slot: unchanged
    assert followups._rounded(NOW, None) == NOW
    due = followups.check(
        {"key": "k", "in": "1m", "prompt": "p", "resolution": "15m"}, NOW, providers=["echo"]
    ).due_at
    assert due == datetime(2026, 3, 2, 9, 15, tzinfo=UTC)  # 09:08:30 rounded up
