"""The words of the ledger: every status and reason a row can hold, written once.

The values are the strings stored in Postgres (the schema's CHECK constraints list the same
sets, and tests/test_domain.py keeps the two in agreement). ``StrEnum`` members compare equal to
those strings, so rows read from asyncpg need no conversion to be matched against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any


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
class ScheduleInput:
    """What a user may set on a schedule, checked (``ops.inputs.validate`` builds it): the
    values ``store.queries.schedule_insert`` and ``schedule_update`` write, field by field."""

    name: str
    kind: str
    expression: str
    prompt: str
    timezone: str = "UTC"
    provider: str = "echo"
    model: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    misfire: str = "run_once"
    misfire_cap: int = 100
    misfire_grace: timedelta = timedelta(seconds=60)
    catchup_window: timedelta | None = None
    overlap: str = "skip"
    max_attempts: int = 3
    timeout: timedelta = timedelta(minutes=5)
    jitter: timedelta | None = None
    dst_gap: str = "shift"
    dst_fold: str = "first"
    enabled: bool = True
    pause_after_failures: int | None = None
    notify: Mapping[str, Any] = field(default_factory=dict)
