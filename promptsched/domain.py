"""The words of the ledger: every status and reason a row can hold, written once.

The values are the strings stored in Postgres (the schema's CHECK constraints list the same
sets, and tests/test_domain.py keeps the two in agreement). ``StrEnum`` members compare equal to
those strings, so rows read from asyncpg need no conversion to be matched against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID


class RunStatus(StrEnum):
    """``runs.status``: pending → running → succeeded | pending (retry) | dead | cancelled."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"

    @property
    def finished(self) -> bool:
        return self not in (RunStatus.PENDING, RunStatus.RUNNING)


class AttemptStatus(StrEnum):
    """``run_attempts.status``: how one claim of a run ended."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    RELEASED = "released"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


class OutboxStatus(StrEnum):
    """``outbox.status``: an owed notification's delivery."""

    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    DEAD = "dead"


class RunOrigin(StrEnum):
    """``runs.origin``: why a run row exists."""

    CADENCE = "cadence"
    MANUAL = "manual"
    BACKFILL = "backfill"
    REPLAY = "replay"


class OutboxEvent(StrEnum):
    """``outbox.event``: what a notification tells its target."""

    SUCCEEDED = "succeeded"
    DEAD = "dead"
    PAUSED = "paused"


class ChangeAction(StrEnum):
    """``schedule_changes.action``: one row of a schedule's history."""

    CREATE = "create"
    UPDATE = "update"
    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"
    TRIGGER = "trigger"
    BACKFILL = "backfill"
    AUTO_PAUSE = "auto_pause"
    AUTO_RESUME = "auto_resume"


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """One run a worker claimed (run_claim_batch), with its schedule as re-read at claim time."""

    id: int
    schedule_id: int
    slot: datetime
    attempt_id: UUID
    attempts: int  # this attempt's number: 1 for the first claim
    releases: int  # claims handed back on drain, which do not count against max_attempts
    max_attempts: int
    name: str
    prompt: str
    model: str
    params: dict[str, Any] | None
    timezone: str
    enabled: bool
    timeout_seconds: float
    start_lag: float  # seconds from the slot to the claim
