"""The domain's enums and the schema's CHECK constraints name the same values, and the typed
rows have exactly the columns of their tables."""

from __future__ import annotations

import re
from dataclasses import fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched import domain
from promptsched.store import queries
from tests import factories

SCHEMA = Path(__file__).resolve().parent.parent / "promptsched/store/sql/schema.sql"

CHECKS: list[tuple[str, type[StrEnum]]] = [
    ("runs_status_check", domain.RunStatus),
    ("outbox_status_check", domain.OutboxStatus),
    ("runs_origin_check", domain.RunOrigin),
    ("outbox_event_check", domain.OutboxEvent),
    ("schedule_changes_action_check", domain.ChangeAction),
    ("followups_state_check", domain.FollowupState),
]


def _allowed(constraint: str) -> set[str]:
    line = next(
        line for line in SCHEMA.read_text().splitlines() if f"CONSTRAINT {constraint} " in line
    )
    return set(re.findall(r"'([a-z_]+)'::text", line))


@pytest.mark.parametrize(("constraint", "enum"), CHECKS, ids=[c for c, _ in CHECKS])
def test_enum_matches_schema_check(constraint: str, enum: type[StrEnum]) -> None:
    assert {member.value for member in enum} == _allowed(constraint)


def test_ended_attempt_rows_hold_every_attempt_status_a_run_row_does_not() -> None:
    """A running attempt and a succeeded one live in their run row; every other ending is a
    row of ended_attempts (0013_two_writes_per_run.sql)."""
    in_run_row = {domain.AttemptStatus.RUNNING, domain.AttemptStatus.SUCCEEDED}
    ended = {member.value for member in domain.AttemptStatus} - in_run_row
    assert ended == _allowed("ended_attempts_status_check")


def test_finished_run_statuses() -> None:
    finished = {status for status in domain.RunStatus if status.finished}
    assert finished == {"succeeded", "dead", "cancelled", "skipped"}


async def test_schedule_fields_are_the_table_columns(pool: asyncpg.Pool[Any]) -> None:
    """A column added by a migration without a field on ``Schedule`` (or a field without a
    column) fails here, not as a KeyError in a request."""
    columns = await pool.fetch(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'schedules' "
        "ORDER BY ordinal_position"
    )
    assert [f.name for f in fields(domain.Schedule)] == [c["column_name"] for c in columns]


async def test_schedule_wrappers_return_the_stored_row(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(
        pool, kind="every", expression="every 30m", timezone="Asia/Tokyo"
    )
    got = await queries.schedule_get(pool, sid, None)
    assert isinstance(got, domain.Schedule)
    stored = await pool.fetchrow("SELECT * FROM schedules WHERE id = $1", sid)
    assert stored is not None
    assert {f.name: getattr(got, f.name) for f in fields(got)} == dict(stored)
    paused = await queries.schedule_pause(pool, sid, None, None, "maintenance")
    assert paused is not None and paused.enabled is False and paused.pause_reason == "maintenance"
    assert paused.version == got.version + 1
    assert await queries.schedule_get(pool, sid, "someone-else") is None
