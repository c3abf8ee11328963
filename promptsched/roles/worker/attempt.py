"""How one attempt ends: a pure decision from what happened to the final write it owes.

The pool runs the executor and observes the outcome; ``settle`` says what that outcome means for
the run's row (and nothing else: no clock, no randomness of its own, no I/O), so every way an
attempt can end is one line of a table test (tests/test_attempt.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import Any

from promptsched import budgets, fallback, storable
from promptsched.domain import AttemptStatus, ClaimedRun, RunStatus
from promptsched.durations import format_duration
from promptsched.errors import ExecutorError
from promptsched.executors import settings
from promptsched.executors.base import ExecutionResult
from promptsched.monitor import changes, conditions
from promptsched.retry import RetryPolicy, decide
from promptsched.roles.worker.inflight import StopReason
from promptsched.store import queries

# What the executor produced: a result, an error, or None when it was stopped early.
Outcome = ExecutionResult | ExecutorError | None

# A throttled answer without a wait of its own (no Retry-After, no rate-limit headers): the run
# waits 2 s doubling per throttled attempt up to a minute (the window of the per-minute limits
# that answer this way), with equal jitter.
THROTTLE_BASE = 2.0
THROTTLE_MAX = 60.0


def stored(outcome: Outcome) -> Outcome:
    """The outcome as it can be stored: every text and JSON value of a result or an error
    (its output, answer, structured data, usage, message) through ``storable.clean``, which
    counts what it replaced in what the run stores; the outcome itself when all was
    storable."""
    if isinstance(outcome, ExecutionResult):
        output, usage = storable.clean(outcome.output), storable.clean(outcome.usage)
        data = storable.clean(outcome.data)
        # read for a follow-up's decision, not stored: not counted
        answer = storable.clean(outcome.answer, counted=False)
        if (output is outcome.output and usage is outcome.usage and data is outcome.data
                and answer is outcome.answer):  # fmt: skip
            return outcome
        return dataclasses.replace(outcome, output=output, usage=usage, answer=answer, data=data)
    if isinstance(outcome, ExecutorError):
        message, usage = storable.clean(outcome.message), storable.clean(outcome.usage)
        if message is outcome.message and usage is outcome.usage:
            return outcome
        return type(outcome)(
            message, retry_after=outcome.retry_after, usage=usage, pace=outcome.pace
        )
    return outcome


def refused(item: queries.Finish, reason: str) -> queries.Finish:
    """The write an attempt ends with when Postgres refused its own final write, alone (the
    finalizer wrote the rest of its batch without it): the run is dead with the database's
    reason, and keeps only what the attempt used. Its provider is not asked again: its answer
    came, and could not be kept. A follow-up's check ends."""
    return queries.Finish(
        item.run_id,
        item.attempt_id,
        RunStatus.DEAD,
        AttemptStatus.FAILED,
        error=f"could not store the attempt's result, the database refused it ({reason}); "
        "the provider was not called again",
        provider=item.provider,
        model=item.model,
        check={"decision": None} if item.check is not None else None,
        cleaned=item.cleaned,
    )


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
    unavailable: Collection[str] = (),
    provider: str | None = None,
    model: str | None = None,
) -> queries.Finish | None:
    """The attempt's final write; None when it must write nothing (its lease is gone).

    ``usage`` is the attempt's usage as the worker accounted it (priced, whatever the
    outcome); without it, a result's own usage is kept.

    In order of precedence: a lease lost (fenced) or handed back (released) writes nothing;
    a cancel asked for by the run's owner, or an attempt stopped without an outcome, ends the
    run ``cancelled``; a result ``succeeded``; an error retries (``pending`` at a backoff) or
    ends ``dead`` as the retry policy decides; a throttled answer waits as asked without
    counting against ``max_attempts``, until the schedule's ``give_up_after``. Attempts handed
    back on drain do not count against ``max_attempts`` either. A retry after a retryable
    failure or throttling goes to the next place of the schedule's route (its fallbacks),
    skipping providers in ``unavailable`` (breaker open) where it can. ``jitter`` is in [0, 1).
    ``provider`` and ``model`` are what the attempt used; the write records them (given here,
    the write is built once: a copy of it per attempt was a few per cent of a drain's CPU).
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
            provider=provider,
            model=model,
        )
    if isinstance(outcome, ExecutionResult):
        return queries.Finish(
            run.id,
            run.attempt_id,
            RunStatus.SUCCEEDED,
            AttemptStatus.SUCCEEDED,
            output=outcome.output,
            usage=usage if usage is not None else dict(outcome.usage) if outcome.usage else None,
            provider=provider,
            model=model,
        )
    if outcome.throttled:
        return _throttled(
            run, outcome, jitter=jitter, usage=usage, unavailable=unavailable,
            provider=provider, model=model,
        )  # fmt: skip
    decision = decide(
        retryable=outcome.retryable,
        retry_after=outcome.retry_after,
        attempt=run.counted_attempts,
        policy=RetryPolicy(run.max_attempts, retry_base, retry_max),
        jitter=jitter,
    )
    if decision.action == "retry":
        moved = _fallback(run, unavailable)
        return queries.Finish(
            run.id,
            run.attempt_id,
            RunStatus.PENDING,
            AttemptStatus.FAILED,
            error=outcome.message,
            retry_in=timedelta(0) if _forward(run, moved) else decision.delay,
            usage=usage,
            reroute=_reroute(moved),
            provider=provider,
            model=model,
        )
    return queries.Finish(
        run.id,
        run.attempt_id,
        RunStatus.DEAD,
        AttemptStatus.FAILED,
        error=outcome.message,
        usage=usage,
        provider=provider,
        model=model,
    )


def watched(run: ClaimedRun, item: queries.Finish, outcome: Outcome) -> queries.Finish:
    """A success's structured output, and what decides whether it notifies (docs/monitors.md):
    a condition on the structured output is decided here; ``changed`` leaves a fingerprint
    for the finish to compare with the schedule's memory (monitor_decide)."""
    if item.status != RunStatus.SUCCEEDED or not isinstance(outcome, ExecutionResult):
        return item
    data = outcome.data
    if data is not None:
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


def _fallback(run: ClaimedRun, unavailable: Collection[str]) -> fallback.Place | None:
    places = fallback.route(run.schedule_provider, run.schedule_model, run.fallback)
    current = run.route if run.route < len(places) else 0
    return fallback.next_place(places, current, unavailable=unavailable)


def _forward(run: ClaimedRun, moved: fallback.Place | None) -> bool:
    """The next attempt goes on to a later place of the route: it need not wait for the
    provider that failed (going back to the first place waits as asked)."""
    return moved is not None and moved.index > run.route


def _reroute(moved: fallback.Place | None) -> tuple[int, str, str | None] | None:
    return None if moved is None else (moved.index, moved.provider, moved.model)


def throttle_wait(run: ClaimedRun, outcome: ExecutorError, jitter: float) -> tuple[float, bool]:
    """How long a throttled run waits, and whether the provider said so: its Retry-After or
    its rate-limit headers' reset, never shortened (up to a tenth longer, spread by
    ``jitter``); else THROTTLE_BASE doubling per throttled attempt up to THROTTLE_MAX."""
    asked = outcome.retry_after
    if asked is None and outcome.pace is not None:
        asked = outcome.pace.seconds
    if asked is not None:
        return asked + asked * 0.1 * jitter, True
    ceiling = min(THROTTLE_MAX, THROTTLE_BASE * 2 ** min(run.throttles, 30))
    return ceiling / 2 + ceiling / 2 * jitter, False


def _throttled(
    run: ClaimedRun,
    outcome: ExecutorError,
    *,
    jitter: float,
    usage: dict[str, Any] | None,
    unavailable: Collection[str],
    provider: str | None,
    model: str | None,
) -> queries.Finish:
    """A provider that said "not now": the run waits as asked, without spending an attempt,
    until its schedule's give_up_after has passed since its first attempt started."""
    wait, _asked = throttle_wait(run, outcome, jitter)
    moved = _fallback(run, unavailable)
    delay = 0.0 if _forward(run, moved) else wait
    if run.running_for + delay > run.give_up_seconds:
        return queries.Finish(
            run.id,
            run.attempt_id,
            RunStatus.DEAD,
            AttemptStatus.FAILED,
            error=gave_up(run, outcome, provider or run.schedule_provider),
            usage=usage,
            throttled=True,
            wait=timedelta(seconds=wait),
            provider=provider,
            model=model,
        )
    return queries.Finish(
        run.id,
        run.attempt_id,
        RunStatus.PENDING,
        AttemptStatus.FAILED,
        error=outcome.message,
        retry_in=timedelta(seconds=delay),
        usage=usage,
        throttled=True,
        wait=timedelta(seconds=wait),
        reroute=_reroute(moved),
        provider=provider,
        model=model,
    )


def gave_up(run: ClaimedRun, outcome: ExecutorError, provider: str) -> str:
    """The dead run's error: who throttled it, for how long, and what to change (the
    variables of the provider that throttled it)."""
    give_up = format_duration(timedelta(seconds=round(run.give_up_seconds)))
    since = format_duration(timedelta(seconds=round(run.running_for)))
    rate, most = settings.variable(provider, "rate"), settings.variable(provider, "max_concurrency")
    return (
        f"gave up: still throttled when give_up_after ({give_up}) ran out; "
        f"{run.throttles + 1} throttled attempt(s) over {since}, the last: {outcome.message}. "
        f"Raise the schedule's give_up_after, lower the provider's limits ({rate} or {most}) "
        "so the fleet paces itself, or name a fallback provider"
    )


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
