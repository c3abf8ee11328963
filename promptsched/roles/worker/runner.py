"""One claimed run's attempt, from the claim to its queued final write: render the prompt, run
the executor under the attempt's timeout and cancel scope, decide the final write
(``attempt.settle``), count it, and hand it to the finalizer. The pool owns the slots, the
claims and the lifecycle; this owns what happens to each run in between."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup

from promptsched import logs, storable
from promptsched.clock import Clock
from promptsched.config import WorkerSettings
from promptsched.domain import ClaimedRun, RunStatus
from promptsched.errors import (
    AttemptTimeout,
    ExecutorError,
    PermanentError,
    RetryableError,
    ValidationError,
)
from promptsched.executors import decision
from promptsched.executors.base import ExecutionRequest, ExecutionResult, Registry, Step
from promptsched.executors.limiter import Limiter
from promptsched.metrics import Children, Metrics
from promptsched.prices import DEFAULT_MODEL
from promptsched.roles import autopause
from promptsched.roles.worker.attempt import (
    reported_usage,
    settle,
    skip_disabled,
    skip_over_budget,
    stored,
    watched,
)
from promptsched.roles.worker.finalizer import Finalizer, Outcome, Refused
from promptsched.roles.worker.fleet import Fleet
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.roles.worker.inflight import InFlight
from promptsched.roles.worker.prompt import prompt_of
from promptsched.roles.worker.transcript import AttemptLog
from promptsched.store import queries

log = structlog.get_logger("worker")


def _ids(row: ClaimedRun, worker_id: str) -> dict[str, Any]:
    """What every log line of an attempt is bound to."""
    return {
        "run_id": row.id,
        "schedule_id": row.schedule_id,
        "attempt_id": str(row.attempt_id),
        "worker_id": worker_id,
    }


def _counting_usage(
    attempt: InFlight, record: Callable[[Step], Awaitable[None]]
) -> Callable[[Step], Awaitable[None]]:
    """The progress callback, also adding up the usage of each model step into the attempt,
    so an attempt that fails or times out mid-loop still says what it spent."""

    async def progress(step: Step) -> None:
        usage = step.detail.get("usage") if step.kind == "model" else None
        if isinstance(usage, Mapping):
            for key, value in usage.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    attempt.usage[key] = attempt.usage.get(key, 0) + value
        await record(step)

    return progress


class AttemptRunner:
    """Runs the attempts the pool claimed. ``forget`` is the pool's: the attempt is over for
    this process (its permit, its place in flight). ``tg`` is the pool's task group while it
    runs, for the dead-letter auto-pause check that outlives the attempt's slot."""

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        registry: Registry,
        limiters: Mapping[str, Limiter],
        heartbeat: Heartbeat,
        finalizer: Finalizer,
        fleet: Fleet,
        child: Children,
        settings: WorkerSettings,
        worker_id: str,
        forget: Callable[[InFlight], None],
        requeued: Callable[[str, float], None],
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.registry = registry
        self.limiters = limiters
        self.heartbeat = heartbeat
        self.finalizer = finalizer
        self.fleet = fleet
        self._child = child
        self.retry_base = settings.retry_base
        self.retry_max = settings.retry_max
        self.prices = settings.prices
        self.worker_id = worker_id
        self._forget = forget
        self._requeued = requeued
        self.tg: TaskGroup | None = None

    async def run(self, row: ClaimedRun, attempt: InFlight) -> bool:
        """Execute the attempt and queue its final write; False when it queued none (the
        attempt was stopped and its lease is not ours, or it was cancelled on the way)."""
        self.metrics.start_lag.observe(max(0.0, row.start_lag))
        if not row.enabled:
            self.metrics.dropped_ticks.labels("disabled").inc()
            return self._finish(attempt, row, skip_disabled(row))
        if row.over_budget is not None:
            self.metrics.dropped_ticks.labels("budget").inc()
            if logs.enabled("info"):
                log.info("attempt.over_budget", **_ids(row, self.worker_id),
                         budget=row.over_budget.get("key"))  # fmt: skip
            return self._finish(attempt, row, skip_over_budget(row))
        if logs.enabled("debug"):
            log.debug(
                "attempt.started",
                **_ids(row, self.worker_id),
                attempt=row.attempts,
                provider=attempt.provider,
            )
        started = time.monotonic()
        # What the provider, its tools and the transcript brought in, made storable here,
        # where it enters (storable.clean, counted for the run: cleaned_chars).
        with storable.counting() as cleaned:
            outcome = stored(await self._call_executor(row, attempt))
        duration = time.monotonic() - started
        usage = reported_usage(outcome, attempt.usage)
        if self.limiters[attempt.provider].fleet:
            await self.fleet.report(row, attempt, outcome, usage)
        if attempt.permit is not None:
            # A provider's limit bounds its calls in flight, and this call is over: its permit
            # goes back now, not once the final write lands. A fleet-wide limit does not count
            # the run either once its write is queued (InFlightAttempts.finish): the claims of
            # this process pass such runs to provider_admit (docs/providers.md). Only after the
            # breaker heard of it, so a half-open breaker's probe is never counted as neither
            # running nor reported.
            attempt.permit.release()
        return self._settle(row, attempt, outcome, usage, duration, cleaned.count)

    async def _call_executor(
        self, row: ClaimedRun, attempt: InFlight
    ) -> ExecutionResult | ExecutorError | None:
        """The attempt's outcome; None when it was stopped (fenced, released or cancelled).

        One deadline carries both ways an attempt stops early: its timeout, and a heartbeat or
        drain that interrupts it (``InFlight.interrupt``, which records its stop reason first
        and expires the deadline at once). An asyncio timeout, not an anyio cancel scope: a
        scope's enter, exit and cancellation cost an attempt a tenth of its CPU at thousands in
        flight (W9, py-spy), and nothing here needs more than one cancellation.
        """
        timeout = row.timeout_seconds
        if attempt.stopped:  # stopped before it started
            return None
        try:
            async with asyncio.timeout(timeout) as deadline:
                attempt.deadline = deadline
                outcome = await self._attempt(row, attempt)
        except TimeoutError:
            if attempt.stopped:
                return None
            return AttemptTimeout(f"timed out after {timeout:g}s")
        finally:
            attempt.deadline = None
        if attempt.stopped:
            return None
        return outcome

    async def _attempt(self, row: ClaimedRun, attempt: InFlight) -> ExecutionResult | ExecutorError:
        try:
            prompt, params = await prompt_of(self.pool, row)
        except ValidationError as exc:
            return PermanentError(f"bad prompt template: {exc}")
        except Exception as exc:  # the database failed mid-read (asyncpg raises more than
            # PostgresError when a connection dies): this attempt fails, the worker lives on
            return RetryableError(f"could not read the run's context: {exc!r}")
        request = ExecutionRequest(
            run_id=row.id,
            schedule_id=row.schedule_id,
            schedule_name=row.name,
            attempt_id=row.attempt_id,
            attempt=row.attempts,
            slot=row.slot,
            timezone=row.timezone,
            prompt=prompt,
            model=row.model,
            params=params,
            timeout=row.timeout_seconds,
            output_schema=row.output_schema,
            followup=(
                {"key": row.followup_key, "vars": dict(row.vars or {})}
                if row.followup_key is not None else None
            ),
            progress=_counting_usage(attempt, AttemptLog(
                self.pool, self.clock, self.metrics,
                run_id=row.id, attempt_id=row.attempt_id, attempt=row.attempts,
            ).record),
        )  # fmt: skip
        try:
            return await self.registry.get(attempt.provider).execute(request)
        except ExecutorError as exc:
            return exc
        except Exception as exc:  # an executor bug must not take down the worker slot
            log.exception("attempt.executor_crashed", **_ids(row, self.worker_id))
            return RetryableError(f"executor crashed: {exc!r}")

    def _settle(
        self,
        row: ClaimedRun,
        attempt: InFlight,
        outcome: ExecutionResult | ExecutorError | None,
        usage: dict[str, Any],
        duration: float,
        cleaned: int = 0,
    ) -> bool:
        """Queue the attempt's final write; False when it must write nothing. ``cleaned``:
        characters replaced to make its text storable."""
        if attempt.stop.writes_nothing:
            return False  # the lease is gone: this attempt writes nothing (nor counts usage)
        # the model it used: its route's place's, else its provider's default
        used = self.prices.model(attempt.provider, row.model)
        item = settle(
            row,
            attempt.stop,
            outcome,
            retry_base=self.retry_base,
            retry_max=self.retry_max,
            jitter=random.random(),
            usage=self._account(row, attempt.provider, usage, used),
            unavailable=self.fleet.unavailable(),
            provider=attempt.provider,
            model=used,
        )
        assert item is not None  # settle writes nothing only for a lease that is gone
        item = watched(row, item, outcome)
        if cleaned:
            item = dataclasses.replace(item, cleaned=cleaned)
        provider = attempt.provider
        item = self._routed(item, provider)
        if row.followup_key is not None and isinstance(outcome, ExecutionResult):
            if item.status == RunStatus.SUCCEEDED:
                # read from storable text, yet a JSON escape in it may spell a NUL again
                found = storable.clean(decision.read(outcome.answer, outcome.output))
                item = dataclasses.replace(item, check={"decision": found})
        if item.status == RunStatus.CANCELLED:
            self._child(self.metrics.run_duration, provider, "cancelled").observe(duration)
        elif item.status == RunStatus.SUCCEEDED:
            self._child(self.metrics.run_duration, provider, "succeeded").observe(duration)
        else:
            self._child(self.metrics.run_duration, provider, "failed").observe(duration)
            if item.throttled:
                self._child(self.metrics.throttled_attempts, provider).inc()
            if item.status == RunStatus.PENDING:
                if not item.throttled:
                    self.metrics.retries.labels(provider).inc()
            else:
                self.metrics.dead_letters.labels(provider).inc()
        return self._finish(attempt, row, item)

    def _routed(self, item: queries.Finish, provider: str) -> queries.Finish:
        """A move to a fallback that this process does not know (the configuration changed
        since the schedule was saved) stays where it is. A move is counted by provider pair.
        (The provider the attempt used is written by ``_finish``.)"""
        if item.reroute is None:
            return item
        target = item.reroute[1]
        if target not in self.limiters:
            return dataclasses.replace(item, reroute=None)
        if target != provider:
            self._child(self.metrics.provider_fallbacks, provider, target).inc()
        return item

    def _account(
        self, row: ClaimedRun, provider: str, usage: dict[str, Any], used: str | None
    ) -> dict[str, Any] | None:
        """The attempt's reported usage (``reported_usage``) with, when the server prices the
        provider, its ``cost``; counted in the token and cost metrics under ``used``, the model
        it used. None when empty."""
        if not usage:
            return None
        prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        prices = self.prices
        # A bounded label: a model neither priced nor a provider's default is "other".
        model = self.metrics.model(provider, used or DEFAULT_MODEL)
        for kind, count in (("prompt", prompt), ("completion", completion)):
            if count:
                self._child(self.metrics.llm_tokens, provider, model, kind).inc(count)
        cost = prices.cost(provider, row.model, usage)
        if cost is not None:
            usage["cost"] = cost
            self._child(self.metrics.llm_cost, provider, model).inc(cost)
        return usage

    def _finish(self, attempt: InFlight, row: ClaimedRun, item: queries.Finish) -> bool:
        # the model it used: its route's place's, else its provider's default (settle writes
        # both into an attempt's own write; the skips are built without them)
        if item.provider is None:
            used = self.prices.model(attempt.provider, row.model)
            item = dataclasses.replace(item, provider=attempt.provider, model=used)
        if row.followup_key is not None and item.status != RunStatus.PENDING and not item.check:
            # A follow-up's check ended: the finish records it (and any next check).
            item = dataclasses.replace(item, check={"decision": None})
        # From here on the write's own guard fences, not the heartbeat; the call is over.
        self.heartbeat.inflight.finish(attempt)
        self.finalizer.submit(
            item, lambda outcome: self._finished_write(attempt, row, item, outcome)
        )
        return True

    def _finished_write(
        self, attempt: InFlight, row: ClaimedRun, item: queries.Finish, outcome: Outcome
    ) -> None:
        """Called by the finalizer once the attempt's final write landed, was fenced or failed."""
        forget = True
        try:
            if isinstance(outcome, Refused):
                # Postgres refused this write alone; the run ended dead with the reason instead.
                self.metrics.role_errors.labels("worker").inc()
                if item.status != RunStatus.DEAD:
                    self.metrics.dead_letters.labels(attempt.provider).inc()
                item, outcome = outcome.replacement, outcome.landed
            if isinstance(outcome, Exception):
                # Whether the write landed is unknown. If not, the run keeps our lease until it
                # expires (this attempt no longer heartbeats) and the reaper decides.
                self.metrics.role_errors.labels("worker").inc()
                log.warning(
                    "attempt.finalize_failed",
                    **_ids(row, self.worker_id),
                    status=item.status,
                    error=repr(outcome),
                )
            elif not outcome:
                self._child(self.metrics.fenced_writes, "finish").inc()
                self.heartbeat.fence(attempt, "finalize_rejected")
            else:
                if item.status == RunStatus.PENDING:  # due again after retry_in, maybe elsewhere
                    wait = item.retry_in.total_seconds() if item.retry_in is not None else 0.0
                    target = item.reroute[1] if item.reroute is not None else attempt.provider
                    self._requeued(target, wait)
                else:
                    self._child(self.metrics.runs_finished, item.status).inc()
                if item.status == RunStatus.DEAD and self.tg is not None:
                    # The attempt stays ours until the check is done, so drain waits for it.
                    self.tg.start_soon(self._autopause, attempt, row)
                    forget = False
                if logs.enabled("info"):
                    log.info(
                        f"run.{item.status}",
                        **_ids(row, self.worker_id),
                        attempt=row.attempts,
                        error=item.error,
                        retry_in=str(item.retry_in) if item.retry_in is not None else None,
                    )
        finally:
            if forget:
                self._forget(attempt)

    async def _autopause(self, attempt: InFlight, row: ClaimedRun) -> None:
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await autopause.check(self.pool, row.schedule_id, row.id, self.clock.sql_now())
        except Exception as exc:  # the run is dead already; its next death checks again
            self.metrics.role_errors.labels("worker").inc()
            log.warning("autopause.check_failed", **_ids(row, self.worker_id), error=repr(exc))
        finally:
            self._forget(attempt)
