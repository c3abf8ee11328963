"""How one attempt ends: a pure decision from what happened to the final write it owes.

The pool runs the executor and observes the outcome; ``settle`` says what that outcome means for
the run's row (and nothing else: no clock, no randomness of its own, no I/O), so every way an
attempt can end is one line of a table test (tests/test_attempt.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from promptsched import budgets
from promptsched.domain import AttemptStatus, ClaimedRun, RunStatus
from promptsched.errors import ExecutorError
from promptsched.executors.base import ExecutionResult
from promptsched.monitor import changes, conditions
from promptsched.retry import RetryPolicy, decide
from promptsched.roles.worker.heartbeat import StopReason
from promptsched.store import queries

# What the executor produced: a result, an error, or None when it was stopped early.
Outcome = ExecutionResult | ExecutorError | None


def reported_usage(outcome: Outcome, agent_steps: Mapping[str, int]) -> dict[str, Any]:
    """An attempt's usage as its provider reported it: its result's or its error's, or else
    what its agent steps reported before it stopped (``agent_steps``), with ``total_tokens``;
    empty when nothing was reported."""
    reported = outcome.usage if outcome is not None else None
    usage: dict[str, Any] = dict(reported or agent_steps)
    if usage:
        prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        usage.setdefault("total_tokens", prompt + completion)
    return usage


def settle(
    run: ClaimedRun,
    stop: StopReason,
    outcome: Outcome,
    *,
    retry_base: timedelta,
    retry_max: timedelta,
    jitter: float,
    usage: dict[str, Any] | None = None,
) -> queries.Finish | None:
    """The attempt's final write; None when it must write nothing (its lease is gone).

    ``usage`` is the attempt's usage as the worker accounted it (priced, whatever the
    outcome); without it, a result's own usage is kept.

    In order of precedence: a lease lost (fenced) or handed back (released) writes nothing;
    a cancel asked for by the run's owner, or an attempt stopped without an outcome, ends the
    run ``cancelled``; a result ``succeeded``; an error retries (``pending`` at a backoff) or
    ends ``dead`` as the retry policy decides. Attempts handed back on drain do not count
    against ``max_attempts``. ``jitter`` is in [0, 1).
    """
    if stop.writes_nothing:
        return None
    if stop is StopReason.CANCEL_REQUESTED or outcome is None:
        return queries.Finish(
            run.id,
            run.attempt_id,
            RunStatus.CANCELLED,
            AttemptStatus.CANCELLED,
            error="cancelled while running",
            usage=usage,
        )
    if isinstance(outcome, ExecutionResult):
        return queries.Finish(
            run.id,
            run.attempt_id,
            RunStatus.SUCCEEDED,
            AttemptStatus.SUCCEEDED,
            output=outcome.output,
            usage=usage if usage is not None else dict(outcome.usage) if outcome.usage else None,
        )
    decision = decide(
        retryable=outcome.retryable,
        retry_after=outcome.retry_after,
        attempt=run.attempts - run.releases,
        policy=RetryPolicy(run.max_attempts, retry_base, retry_max),
        jitter=jitter,
    )
    if decision.action == "retry":
        return queries.Finish(
            run.id,
            run.attempt_id,
            RunStatus.PENDING,
            AttemptStatus.FAILED,
            error=outcome.message,
            retry_in=decision.delay,
            usage=usage,
        )
    return queries.Finish(
        run.id,
        run.attempt_id,
        RunStatus.DEAD,
        AttemptStatus.FAILED,
        error=outcome.message,
        usage=usage,
    )


def watched(run: ClaimedRun, item: queries.Finish, outcome: Outcome) -> queries.Finish:
    """A success's structured output, and what decides whether it notifies (docs/monitors.md):
    a condition on the structured output is decided here; ``changed`` leaves a fingerprint
    for the finish to compare with the schedule's memory (monitor_decide)."""
    if item.status != RunStatus.SUCCEEDED or not isinstance(outcome, ExecutionResult):
        return item
    data = outcome.data
    item = dataclasses.replace(item, output_json=data)
    condition = conditions.parsed(run.notify_when)
    if condition.kind == "always":
        return item
    if condition.kind == "changed":
        if condition.pointer:
            found, value = conditions.resolve(data, condition.pointer)
            mark = changes.pointer_fingerprint(found and data is not None, value)
        elif data is not None:
            mark = changes.fingerprint(outcome.output, data)
        else:
            mark = changes.fingerprint(outcome.output)
        watch = {"fingerprint": mark, "what": condition.pointer or "output"}
        return dataclasses.replace(item, watch=watch)
    verdict = conditions.decide(condition, data)
    decision = {"notify": verdict.notify, "reason": verdict.reason, "when": run.notify_when}
    return dataclasses.replace(item, decision=decision)


def skip_disabled(run: ClaimedRun) -> queries.Finish:
    """A run whose schedule was disabled by the time it was claimed is skipped, not executed."""
    return queries.Finish(
        run.id, run.attempt_id, RunStatus.SKIPPED, AttemptStatus.SKIPPED, skip_reason="disabled"
    )


def skip_over_budget(run: ClaimedRun) -> queries.Finish:
    """A run claimed while a budget of its schedule or owner is reached is skipped, not sent;
    its finish owes the owner the period's one notice of it."""
    assert run.over_budget is not None
    return queries.Finish(
        run.id,
        run.attempt_id,
        RunStatus.SKIPPED,
        AttemptStatus.SKIPPED,
        error=f"not sent: {budgets.reached(run.over_budget)}",
        skip_reason="budget",
        notice=run.over_budget,
    )
