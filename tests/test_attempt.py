"""How an attempt ends (roles/worker/attempt.settle): every way, as one table of pure cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from promptsched.domain import AttemptStatus, ClaimedRun, RunStatus
from promptsched.errors import AttemptTimeout, PermanentError, RetryableError
from promptsched.executors.base import ExecutionResult
from promptsched.roles.worker.attempt import Outcome, settle, skip_disabled
from promptsched.roles.worker.inflight import InFlight, StopReason
from promptsched.store import queries

ATTEMPT = UUID(int=7)
BASE = timedelta(seconds=2)
CAP = timedelta(hours=1)


def run(*, attempts: int = 1, releases: int = 0, max_attempts: int = 3) -> ClaimedRun:
    return ClaimedRun(
        id=1,
        schedule_id=2,
        slot=datetime(2026, 1, 1, tzinfo=UTC),
        attempt_id=ATTEMPT,
        attempts=attempts,
        releases=releases,
        max_attempts=max_attempts,
        name="s",
        prompt="p",
        model="m",
        params=None,
        timezone="UTC",
        enabled=True,
        timeout_seconds=30.0,
        start_lag=0.0,
    )


def finish(status: RunStatus, attempt_status: AttemptStatus, **fields: Any) -> queries.Finish:
    return queries.Finish(1, ATTEMPT, status, attempt_status, **fields)


OK = ExecutionResult("hi", {"tokens": 3})
FLAKY = RetryableError("503")
LATER = RetryableError("429", retry_after=100.0)
BROKEN = PermanentError("400")
CANCELLED = finish(RunStatus.CANCELLED, AttemptStatus.CANCELLED, error="cancelled while running")

# (stop reason, outcome, attempts, releases, max_attempts) -> the final write (None: nothing)
CASES: list[tuple[StopReason, Outcome, int, int, int, queries.Finish | None]] = [
    # a lease lost or handed back writes nothing, whatever the executor said
    (StopReason.FENCED, OK, 1, 0, 3, None),
    (StopReason.FENCED, None, 1, 0, 3, None),
    (StopReason.RELEASED, OK, 1, 0, 3, None),
    (StopReason.RELEASED, BROKEN, 1, 0, 3, None),
    # a cancel asked for wins over the outcome; so does an attempt stopped without one
    (StopReason.CANCEL_REQUESTED, OK, 1, 0, 3, CANCELLED),
    (StopReason.CANCEL_REQUESTED, BROKEN, 1, 0, 3, CANCELLED),
    (StopReason.NONE, None, 1, 0, 3, CANCELLED),
    # a result succeeds, with its usage
    (
        StopReason.NONE, OK, 1, 0, 3,
        finish(RunStatus.SUCCEEDED, AttemptStatus.SUCCEEDED, output="hi", usage={"tokens": 3}),
    ),
    (
        StopReason.NONE, ExecutionResult("", None), 3, 0, 3,
        finish(RunStatus.SUCCEEDED, AttemptStatus.SUCCEEDED, output="", usage=None),
    ),
    # a retryable error retries at the backoff (jitter 0: half the ceiling, base * 2^(n-1))
    (
        StopReason.NONE, FLAKY, 1, 0, 3,
        finish(RunStatus.PENDING, AttemptStatus.FAILED, error="503", retry_in=timedelta(seconds=1)),
    ),
    (
        StopReason.NONE, FLAKY, 2, 0, 3,
        finish(RunStatus.PENDING, AttemptStatus.FAILED, error="503", retry_in=timedelta(seconds=2)),
    ),
    (
        StopReason.NONE, AttemptTimeout("timed out after 30s"), 1, 0, 3,
        finish(
            RunStatus.PENDING, AttemptStatus.FAILED, error="timed out after 30s",
            retry_in=timedelta(seconds=1),
        ),
    ),
    # the provider's Retry-After is a floor
    (
        StopReason.NONE, LATER, 1, 0, 3,
        finish(
            RunStatus.PENDING, AttemptStatus.FAILED, error="429", retry_in=timedelta(seconds=100)
        ),
    ),
    # the last attempt dies; so does any permanent error
    (StopReason.NONE, FLAKY, 3, 0, 3, finish(RunStatus.DEAD, AttemptStatus.FAILED, error="503")),
    (StopReason.NONE, BROKEN, 1, 0, 3, finish(RunStatus.DEAD, AttemptStatus.FAILED, error="400")),
    # attempts handed back on drain do not count against max_attempts
    (
        StopReason.NONE, FLAKY, 3, 1, 3,
        finish(RunStatus.PENDING, AttemptStatus.FAILED, error="503", retry_in=timedelta(seconds=2)),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("stop", "outcome", "attempts", "releases", "most", "expected"), CASES)
def test_settle_decides_the_final_write(
    stop: StopReason,
    outcome: Outcome,
    attempts: int,
    releases: int,
    most: int,
    expected: queries.Finish | None,
) -> None:
    got = settle(
        run(attempts=attempts, releases=releases, max_attempts=most),
        stop,
        outcome,
        retry_base=BASE,
        retry_max=CAP,
        jitter=0.0,
    )
    assert got == expected


def test_a_disabled_schedules_run_is_skipped() -> None:
    assert skip_disabled(run()) == finish(
        RunStatus.SKIPPED, AttemptStatus.SKIPPED, skip_reason="disabled"
    )


async def test_a_stronger_stop_reason_replaces_a_weaker_one_never_the_reverse() -> None:
    attempt = InFlight(1, ATTEMPT, "echo", None)
    assert not attempt.stopped
    assert attempt.stop_for(StopReason.CANCEL_REQUESTED)
    assert not attempt.stop_for(StopReason.CANCEL_REQUESTED)  # once: logged once
    assert attempt.stop_for(StopReason.RELEASED)
    assert attempt.stop_for(StopReason.FENCED) and attempt.fenced
    assert not attempt.stop_for(StopReason.RELEASED)
    assert not attempt.stop_for(StopReason.CANCEL_REQUESTED)
    assert attempt.stop is StopReason.FENCED


async def test_a_wound_down_attempt_does_not_remove_the_runs_next_attempt() -> None:
    """A fenced attempt that finishes after this process claimed its run again leaves the new
    attempt in the registry (the heartbeat keeps renewing the lease it holds)."""
    from uuid import uuid4

    from promptsched.roles.worker.inflight import InFlight, InFlightAttempts

    registry = InFlightAttempts()
    old = InFlight(run_id=7, attempt_id=uuid4(), provider="echo", permit=None)
    new = InFlight(run_id=7, attempt_id=uuid4(), provider="echo", permit=None)
    registry.add(old)
    registry.add(new)  # the run was claimed again while the old attempt wound down
    registry.discard(old)
    assert registry.current(new) and list(registry) == [7]
    registry.discard(new)
    assert len(registry) == 0
