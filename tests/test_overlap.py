"""Overlap decisions, pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from promptsched.schedule import overlap
from promptsched.schedule.policies import PlannedRun

T = datetime(2026, 3, 2, 9, tzinfo=UTC)


def _planned(n: int) -> tuple[PlannedRun, ...]:
    return tuple(PlannedRun(T + timedelta(seconds=i), "pending", None, 0) for i in range(n))


@pytest.mark.parametrize(
    ("policy", "pending", "running", "expected", "cancel"),
    [
        ("skip", 0, 0, ["pending", "skipped", "skipped"], False),
        ("skip", 0, 1, ["skipped", "skipped", "skipped"], False),
        ("allow", 1, 1, ["pending", "pending", "pending"], False),
        ("buffer_one", 0, 0, ["pending", "pending", "skipped"], False),
        ("buffer_one", 0, 1, ["pending", "skipped", "skipped"], False),
        ("buffer_one", 1, 1, ["skipped", "skipped", "skipped"], False),
        ("buffer_all", 3, 1, ["pending", "pending", "pending"], False),
        ("cancel_other", 0, 0, ["skipped", "skipped", "pending"], False),
        ("cancel_other", 0, 1, ["skipped", "skipped", "pending"], True),
    ],
)
def test_overlap_decisions(
    policy: overlap.Policy, pending: int, running: int, expected: list[str], cancel: bool
) -> None:
    decision = overlap.apply(policy, pending=pending, running=running, planned=_planned(3))
    assert [run.status for run in decision.runs] == expected
    assert all(r.skip_reason == "overlap" for r in decision.runs if r.status == "skipped")
    assert decision.cancel_unfinished is cancel


def test_coalesced_misfire_rows_pass_through() -> None:
    planned = (PlannedRun(T, "skipped", "misfire", 5), *_planned(1))
    decision = overlap.apply("skip", pending=0, running=0, planned=planned)
    assert [(r.status, r.skip_reason) for r in decision.runs] == [
        ("skipped", "misfire"),
        ("pending", None),
    ]
