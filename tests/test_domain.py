"""The domain's enums and the schema's CHECK constraints name the same values."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

import pytest

from promptsched import domain

SCHEMA = Path(__file__).resolve().parent.parent / "promptsched/store/sql/schema.sql"

CHECKS: list[tuple[str, type[StrEnum]]] = [
    ("runs_status_check", domain.RunStatus),
    ("run_attempts_status_check", domain.AttemptStatus),
    ("outbox_status_check", domain.OutboxStatus),
    ("runs_origin_check", domain.RunOrigin),
    ("outbox_event_check", domain.OutboxEvent),
    ("schedule_changes_action_check", domain.ChangeAction),
]


def _allowed(constraint: str) -> set[str]:
    line = next(
        line for line in SCHEMA.read_text().splitlines() if f"CONSTRAINT {constraint} " in line
    )
    return set(re.findall(r"'([a-z_]+)'::text", line))


@pytest.mark.parametrize(("constraint", "enum"), CHECKS, ids=[c for c, _ in CHECKS])
def test_enum_matches_schema_check(constraint: str, enum: type[StrEnum]) -> None:
    assert {member.value for member in enum} == _allowed(constraint)


def test_finished_run_statuses() -> None:
    finished = {status for status in domain.RunStatus if status.finished}
    assert finished == {"succeeded", "dead", "cancelled", "skipped"}
