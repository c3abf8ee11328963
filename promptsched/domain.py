"""The words of the ledger: every status and reason a row can hold, written once.

The values are the strings stored in Postgres (the schema's CHECK constraints list the same
sets, and tests/test_domain.py keeps the two in agreement). ``StrEnum`` members compare equal to
those strings, so rows read from asyncpg need no conversion to be matched against them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

Kind = Literal["cron", "rrule", "at", "every"]  # ``schedules.kind``
DstGap = Literal["shift", "skip"]  # a missing local time: fire just after the gap, or skip it
DstFold = Literal["first", "both"]  # a repeated local time: its first occurrence, or both


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


class DeliveryOutcome(StrEnum):
    """How one claimed notification's turn ended, as the notifier logs and counts it (the
    ``outcome`` label of ``promptsched_deliveries_total`` says ``delivered`` for ``sent``)."""

    SENT = "sent"
    RETRY = "retry"  # back to pending, tried again after a backoff
    DEAD = "dead"
    LOST = "lost"  # its claim expired while sending (the notifier crashed or stalled)
    FENCED = "fenced"  # another notifier took it meanwhile: our mark changed nothing
    RELEASED = "released"  # the notifier stopped before sending it

    @property
    def label(self) -> str:
        return "delivered" if self is DeliveryOutcome.SENT else self.value


class RunOrigin(StrEnum):
    """``runs.origin``: why a run row exists."""

    CADENCE = "cadence"
    MANUAL = "manual"
    BACKFILL = "backfill"
    REPLAY = "replay"
    CHECK = "check"  # a follow-up's next check, asked for by the one before it


class OutboxEvent(StrEnum):
    """``outbox.event``: what a notification tells its target."""

    SUCCEEDED = "succeeded"
    DEAD = "dead"
    PAUSED = "paused"
    DIGEST = "digest"  # the ticks a schedule dropped in a period
    BUDGET = "budget"  # a budget of the schedule or its owner is reached (once per period)
    ESCALATION = "escalation"  # a follow-up still unresolved after a step's number of checks


class FollowupState(StrEnum):
    """``followups.state``: where a keyed follow-up's chain of checks stands."""

    ACTIVE = "active"  # a check is due or running
    DONE = "done"  # a check answered without asking to be checked again
    ENDED = "ended"  # a guard stopped it (``ended_reason``: max_checks, horizon, ...)
    CANCELLED = "cancelled"


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
class DueGroup:
    """One row of ``schedule_take_due``: due schedules (``ids``) that plan alike — the same
    expression, zone, cursor, misfire and overlap settings, copied columns and unfinished
    count (0, 1 or 2 meaning 2+) — and the database's now (``db_now``) they plan against."""

    ids: list[int]
    kind: str
    expression: str
    timezone: str
    dst_gap: str
    dst_fold: str
    next_fire_at: datetime
    misfire_policy: str
    misfire_cap: int
    misfire_grace: timedelta
    catchup_window: timedelta | None
    overlap_policy: str
    jitter: timedelta | None
    provider: str
    max_attempts: int
    unfinished: int
    db_now: datetime
    owners: Sequence[str] = ()  # the owner of each of ``ids``, in their order


@dataclass(frozen=True, slots=True)
class OwedNotification:
    """One outbox row the notifier claimed (``outbox_claim_batch``), with what its message
    says about the run and its schedule. ``claim_token`` fences the write of its outcome."""

    id: int
    run_id: int
    schedule_id: int
    channel: str
    target: Any  # the channel's target: a list of addresses, or a webhook object
    event: OutboxEvent
    attempts: int
    max_attempts: int
    claim_token: UUID
    idempotency_key: str
    schedule_name: str
    owner: str
    timezone: str
    webhook_secret: str | None
    chat_url: str | None  # slack | discord | ntfy: the URL (a credential), read from the schedule
    slot: datetime
    origin: RunOrigin
    run_status: RunStatus
    run_attempts: int
    output: str | None
    error: str | None
    finished_at: datetime | None
    details: Any = None  # digest: {"dropped": {reason: slots}, "total", "period_start", ...}
    output_json: Any = None  # a monitor's structured answer
    # a `changed` monitor's success: the output of the run it was compared with
    previous_output: str | None = None
    previous_json: Any = None
    # a follow-up's check: its key, and where the chain stands after this run
    followup_key: str | None = None
    max_checks: int | None = None
    check_number: int | None = None
    check_outcome: str | None = None
    next_check_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ReapedRun:
    """One row of ``run_reap_expired``: a run whose lease expired or deadline passed, and the
    status it went to (pending for a retry, dead, or cancelled)."""

    id: int
    schedule_id: int
    status: RunStatus
    provider: str
    attempt_id: UUID
    worker_id: str | None
    lease_lost: bool
    woken: int


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
    # what budget of the schedule or its owner was reached (budget_verdict), or None
    over_budget: dict[str, Any] | None = None
    vars: dict[str, Any] | None = None  # template variables (a follow-up's)
    followup_key: str | None = None  # set for a follow-up's checks
    output_schema: dict[str, Any] | None = None  # the JSON Schema its answer must match
    notify_when: str = "always"  # when its success notifies (monitor/conditions.py)
    # Provider weather (0023_provider_weather.sql): throttled attempts so far (they do not
    # count against max_attempts), the run's place in its route (0: the schedule's provider,
    # then its fallbacks in order), the fallbacks, the schedule's own provider and model, its
    # give_up_after in seconds, and the seconds since the run's first attempt started.
    throttles: int = 0
    route: int = 0
    fallback: tuple[str, ...] = ()
    schedule_provider: str = ""
    schedule_model: str | None = None
    give_up_seconds: float = 3600.0
    running_for: float = 0.0

    @property
    def counted_attempts(self) -> int:
        """Attempts that count against ``max_attempts``: neither handed back on drain nor
        throttled."""
        return self.attempts - self.releases - self.throttles


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule: one field per column of ``schedules`` (tests/test_domain.py keeps
    the two in agreement), as every schedule-returning query wrapper gives it."""

    id: int
    owner: str
    name: str
    kind: Kind
    expression: str
    timezone: str
    dst_gap: DstGap
    dst_fold: DstFold
    prompt: str
    provider: str
    model: str | None
    params: dict[str, Any]
    misfire_policy: str
    misfire_cap: int
    misfire_grace: timedelta
    catchup_window: timedelta | None
    overlap_policy: str
    max_attempts: int
    timeout: timedelta
    jitter: timedelta | None
    enabled: bool
    paused_until: datetime | None
    pause_reason: str | None
    pause_after_failures: int | None
    next_fire_at: datetime | None
    version: int
    created_at: datetime
    updated_at: datetime
    notify: dict[str, Any]
    budget: dict[str, Any] | None
    vars: dict[str, Any] | None
    followup_key: str | None
    output_schema: dict[str, Any] | None  # the JSON Schema its answers follow (monitor/schema.py)
    notify_when: str  # when a success notifies (monitor/conditions.py)
    give_up_after: timedelta
    fallback: list[str]


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
    budget: Mapping[str, Any] | None = None
    vars: Mapping[str, Any] | None = None  # template variables (follow-ups set them)
    followup_key: str | None = None  # a follow-up's key (ops/followups.py)
    output_schema: Mapping[str, Any] | None = None  # checked by monitor/schema.py
    notify_when: str = "always"  # as monitor/conditions.py writes it
    # how long a run may keep being throttled before it ends dead (docs/providers.md)
    give_up_after: timedelta = timedelta(hours=1)
    fallback: tuple[str, ...] = ()  # providers to try next, in order: NAME or NAME:MODEL
