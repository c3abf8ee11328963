"""The worker pool owns work: it claims runs, executes them under a lease and a timeout, and
finalizes each attempt conditioned on its fencing token."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup, TaskStatus

from promptsched import logs
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
from promptsched.executors import decision, template
from promptsched.executors.base import ExecutionRequest, ExecutionResult, Registry, Step
from promptsched.executors.limiter import Limiter
from promptsched.metrics import Children, Metrics
from promptsched.roles import autopause
from promptsched.roles.loop import Rush, Wakeup, run_forever
from promptsched.roles.worker.attempt import (
    reported_usage,
    settle,
    skip_disabled,
    skip_over_budget,
)
from promptsched.roles.worker.finalizer import Finalizer, Outcome
from promptsched.roles.worker.fleet import Fleet
from promptsched.roles.worker.heartbeat import Heartbeat, InFlight, InFlightAttempts, StopReason
from promptsched.roles.worker.transcript import AttemptLog
from promptsched.store import queries

log = structlog.get_logger("worker")


def _var_text(value: Any) -> str:
    """A follow-up's var as the prompt shows it (JSON's true/false, not Python's)."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


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


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkerPool:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        registry: Registry,
        limiters: Mapping[str, Limiter],
        heartbeat: Heartbeat,
        settings: WorkerSettings,
        *,
        rush: Rush | None = None,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.rush = rush if rush is not None else Rush()
        self.registry = registry
        self.limiters = dict(limiters)
        self.heartbeat = heartbeat
        # One registry of the attempts in flight, shared with the heartbeat that renews them.
        self.inflight: InFlightAttempts = heartbeat.inflight
        self.slots = settings.slots
        self.worker_id = settings.worker_id or default_worker_id()
        self.finalizer = Finalizer(pool, clock, self.worker_id)
        self.retry_base = settings.retry_base
        self.retry_max = settings.retry_max
        self.max_sleep = settings.max_sleep
        self.prices = settings.prices
        self.wakeup = Wakeup()
        self.claiming = True
        self._blocked_backoff = 0.0
        # Attempts whose executor is running. An attempt whose final write is queued still
        # holds its lease (it stays in ``inflight``, heartbeats go on) but not a slot, so the
        # next claim overlaps the previous batch's write.
        self._executing = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._tg: TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Metric children resolved once: a label lookup per run adds up at thousands of runs/s.
        self._busy_gauge = metrics.worker_slots.labels("busy")
        self._idle_gauge = metrics.worker_slots.labels("idle")
        self._child = Children()
        self.fleet = Fleet(pool, clock, metrics, self._child, self.limiters)
        self._update_slot_gauge()

    def notify(self, _payload: str | None = None) -> None:
        self.wakeup.set()

    def _update_slot_gauge(self) -> None:
        self._busy_gauge.set(self._executing)
        self._idle_gauge.set(max(0, self.slots - self._executing))

    def _free_slots(self) -> int:
        # Queued final writes are bounded too: a database that stops answering must not let
        # a process claim without end. While this process's scheduler writes a rush, one
        # slot (loop.Rush).
        slots = self.rush.slots(self.slots)
        return min(slots - self._executing, 2 * slots - len(self.inflight))

    # --- claiming -------------------------------------------------------------------------

    async def claim(self) -> int:
        """Claim as many runs as free slots and provider limits allow, and start each."""
        started = 0
        for provider, limiter in self.limiters.items():
            want = min(self._free_slots(), limiter.available())
            if want <= 0:
                continue
            if limiter.fleet:
                rows = await self.fleet.claim(provider, want, self.worker_id, self.heartbeat.lease)
            else:
                rows = await queries.run_claim_batch(
                    self.pool,
                    self.clock.sql_now(),
                    provider,
                    want,
                    self.worker_id,
                    self.heartbeat.lease,
                )
            self._count_claim(rows)
            for row in rows:
                permit = limiter.try_acquire()
                attempt = InFlight(
                    row.id,
                    row.attempt_id,
                    provider,
                    permit,
                    row.schedule_id,
                    self.worker_id,
                )
                self.inflight.add(attempt)
                self._executing += 1
                self._start(row, attempt)
                started += 1
            if rows:
                self._idle = anyio.Event()
        self._update_slot_gauge()
        return started

    def _count_claim(self, claim: queries.Claim) -> None:
        """One result per claim: contended when runs it wanted and could have taken were held
        by another claimer (SKIP LOCKED passed them over), whatever it got besides; a run
        waiting for its own schedule's predecessor could not be taken and is no contention."""
        result = "contended" if claim.contended else "claimed" if claim else "empty"
        self._child(self.metrics.claims, result).inc()

    async def seconds_until_work(self) -> float:
        cap = self.max_sleep.total_seconds()
        if self._free_slots() <= 0:
            return cap  # a finishing attempt wakes us
        ready = [p for p, limiter in self.limiters.items() if limiter.available() > 0]
        rate_waits = [limiter.seconds_until_available() for limiter in self.limiters.values()]
        if not ready:
            return max(0.0, min([cap, *rate_waits]))
        if self.fleet.waits:  # a fleet-wide limit held a provider's last claim back
            cap = min(cap, *self.fleet.waits.values())
        ahead = await queries.run_seconds_until_available(self.pool, self.clock.sql_now(), ready)
        if ahead is not None and ahead <= 0:
            # Available work we could not claim: another replica holds it, or a serial run
            # waits for its predecessor. Back off (50 ms doubling to 1 s) rather than spin.
            self._blocked_backoff = min(1.0, max(0.05, self._blocked_backoff * 2))
            return min(cap, self._blocked_backoff)
        self._blocked_backoff = 0.0
        return cap if ahead is None else min(cap, ahead)

    # --- executing ------------------------------------------------------------------------

    def _start(self, row: ClaimedRun, attempt: InFlight) -> None:
        # A plain asyncio task: TaskGroup.start_soon costs four times as much per spawn, which
        # shows at thousands of runs a second. The pool keeps the set and, on the way out,
        # cancels and awaits it itself (_stop_attempts), as a task group would.
        task = asyncio.get_running_loop().create_task(self._execute(row, attempt))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _execute settles every outcome itself; this is a bug, and it must be seen
            self.metrics.role_errors.labels("worker").inc()
            log.error("attempt.crashed", error=repr(exc))

    async def _stop_attempts(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(tasks)

    async def _execute(self, row: ClaimedRun, attempt: InFlight) -> None:
        submitted = False
        try:
            self.metrics.start_lag.observe(max(0.0, row.start_lag))
            if not row.enabled:
                submitted = self._finish(attempt, row, skip_disabled(row))
                self.metrics.dropped_ticks.labels("disabled").inc()
                return
            if row.over_budget is not None:
                submitted = self._finish(attempt, row, skip_over_budget(row))
                self.metrics.dropped_ticks.labels("budget").inc()
                if logs.enabled("info"):
                    log.info("attempt.over_budget", **_ids(row, self.worker_id),
                             budget=row.over_budget.get("key"))  # fmt: skip
                return
            if logs.enabled("debug"):
                log.debug(
                    "attempt.started",
                    **_ids(row, self.worker_id),
                    attempt=row.attempts,
                    provider=attempt.provider,
                )
            started = time.monotonic()
            outcome = await self._call_executor(row, attempt)
            duration = time.monotonic() - started
            usage = reported_usage(outcome, attempt.usage)
            if self.limiters[attempt.provider].fleet:
                await self.fleet.report(row, attempt, outcome, usage)
            submitted = self._settle(row, attempt, outcome, usage, duration)
        finally:
            self._executing -= 1
            if not submitted:
                self._forget(attempt)
            self.wakeup.set()  # a slot is free: the dispatcher claims (and updates the gauge)

    def _forget(self, attempt: InFlight) -> None:
        """The attempt is over for this process: no more heartbeats, its lease is not ours."""
        # The provider permit is held until here, not just while the executor runs: a provider
        # limit of N keeps at most N of its runs `running`, the rest wait as `pending` rows.
        if attempt.permit is not None:
            attempt.permit.release()
        self.inflight.discard(attempt)
        if not self.inflight:
            self._idle.set()
        self.wakeup.set()

    async def _render(self, row: ClaimedRun) -> tuple[str, dict[str, Any]]:
        """The prompt and params of this attempt, templates filled in from the run context."""
        params = dict(row.params or {})
        system = params.get("system")
        given = frozenset(row.vars or {})  # a follow-up's vars
        used = template.variables_used(row.prompt, extra=given) | (
            template.variables_used(system, field="params.system", extra=given)
            if isinstance(system, str)
            else frozenset()
        )
        if not used:  # a prompt without tags is its own rendering
            return row.prompt, params
        previous = None
        if any(v.startswith("previous_") for v in used):
            previous = await queries.run_previous_success(self.pool, row.schedule_id, row.slot)
        context = template.build_context(
            run_id=row.id,
            schedule_id=row.schedule_id,
            schedule_name=row.name,
            slot=row.slot,
            timezone=row.timezone,
            previous_run_at=previous["finished_at"] if previous else None,
            previous_output=previous["output"] if previous else None,
        )
        context.update({name: _var_text(value) for name, value in (row.vars or {}).items()})
        prompt = template.render(row.prompt, context, extra=given)
        if isinstance(system, str):  # a system prompt is a template too
            params["system"] = template.render(system, context, field="params.system", extra=given)
        return prompt, params

    async def _call_executor(
        self, row: ClaimedRun, attempt: InFlight
    ) -> ExecutionResult | ExecutorError | None:
        """The attempt's outcome; None when it was stopped (fenced, released or cancelled).

        One cancel scope carries both ways an attempt stops early: its timeout (the scope's
        deadline) and a heartbeat or drain that cancels it (which records its stop reason first).
        """
        timeout = row.timeout_seconds
        scope = attempt.scope
        outcome: ExecutionResult | ExecutorError | None = None
        with scope:
            scope.deadline = anyio.current_time() + timeout
            outcome = await self._attempt(row, attempt)
        if attempt.stopped:
            return None
        if scope.cancelled_caught:
            return AttemptTimeout(f"timed out after {timeout:g}s")
        return outcome

    async def _attempt(self, row: ClaimedRun, attempt: InFlight) -> ExecutionResult | ExecutorError:
        try:
            prompt, params = await self._render(row)
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
    ) -> bool:
        """Queue the attempt's final write; False when it must write nothing."""
        if attempt.stop.writes_nothing:
            return False  # the lease is gone: this attempt writes nothing (nor counts usage)
        item = settle(
            row,
            attempt.stop,
            outcome,
            retry_base=self.retry_base,
            retry_max=self.retry_max,
            jitter=random.random(),
            usage=self._account(row, attempt.provider, usage),
        )
        assert item is not None  # settle writes nothing only for a lease that is gone
        provider = attempt.provider
        if row.followup_key is not None and isinstance(outcome, ExecutionResult):
            if item.status == RunStatus.SUCCEEDED:
                found = decision.read(outcome.answer, outcome.output)
                item = dataclasses.replace(item, check={"decision": found})
        if item.status == RunStatus.CANCELLED:
            self._child(self.metrics.run_duration, provider, "cancelled").observe(duration)
        elif item.status == RunStatus.SUCCEEDED:
            self._child(self.metrics.run_duration, provider, "succeeded").observe(duration)
        else:
            self._child(self.metrics.run_duration, provider, "failed").observe(duration)
            if item.status == RunStatus.PENDING:
                self.metrics.retries.labels(provider).inc()
            else:
                self.metrics.dead_letters.labels(provider).inc()
        return self._finish(attempt, row, item)

    def _account(
        self, row: ClaimedRun, provider: str, usage: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The attempt's reported usage (``reported_usage``) with, when the server prices the
        provider, its ``cost``; counted in the token and cost metrics. None when empty."""
        if not usage:
            return None
        prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        prices = self.prices
        model = prices.model(provider, row.model) or "default"
        for kind, count in (("prompt", prompt), ("completion", completion)):
            if count:
                self._child(self.metrics.llm_tokens, provider, model, kind).inc(count)
        cost = prices.cost(provider, row.model, usage)
        if cost is not None:
            usage["cost"] = cost
            self._child(self.metrics.llm_cost, provider, model).inc(cost)
        return usage

    def _finish(self, attempt: InFlight, row: ClaimedRun, item: queries.Finish) -> bool:
        if row.followup_key is not None and item.status != RunStatus.PENDING and not item.check:
            # A follow-up's check ended: the finish records it (and any next check).
            item = dataclasses.replace(item, check={"decision": None})
        attempt.finishing = True  # from here on the write's own guard fences, not the heartbeat
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
                if item.status != RunStatus.PENDING:
                    self._child(self.metrics.runs_finished, item.status).inc()
                if item.status == RunStatus.DEAD and self._tg is not None:
                    # The attempt stays ours until the check is done, so drain waits for it.
                    self._tg.start_soon(self._autopause, attempt, row)
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

    # --- lifecycle ------------------------------------------------------------------------

    async def run_once(self) -> int:
        """Drain mode: claim and execute everything due now, then return the number run."""
        total = 0
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await tg.start(self.finalizer.run)
                while True:
                    # Done only when a claim that began with nothing in flight found nothing:
                    # an attempt finishing during the claim's awaits may have freed a limit.
                    idle_before = not self.inflight
                    started = await self.claim()
                    total += started
                    if started == 0 and idle_before and not self.inflight:
                        break
                    await self.wakeup.wait(0.05 if started == 0 else 0)
                tg.cancel_scope.cancel()
        finally:
            await self._stop_attempts()
        return total

    async def _dispatch_once(self) -> float:
        """Claim what can be claimed; how long to wait before the next claim."""
        started = await self.claim()
        if started:
            self._blocked_backoff = 0.0
        return 0.0 if started else await self.seconds_until_work()

    async def _dispatch(self) -> None:
        # asyncpg raises more than PostgresError on a dying connection (InternalClientError
        # after a server shutdown): run_forever survives it, counts it and backs off.
        await run_forever(
            "worker",
            self._dispatch_once,
            self.wakeup,
            self.metrics,
            stopping=lambda: not self.claiming,
            error_event="worker.claim_failed",
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await tg.start(self.heartbeat.run)
                await tg.start(self.finalizer.run)
                task_status.started()
                await self._dispatch()
                await self._idle.wait()
                tg.cancel_scope.cancel()
        finally:
            await self._stop_attempts()

    async def drain(self, grace: timedelta) -> int:
        """Stop claiming, let in-flight attempts finish for ``grace``, then hand the rest back
        at once so another replica claims them without waiting for the lease to expire."""
        self.claiming = False
        self.wakeup.set()
        with anyio.move_on_after(grace.total_seconds()):
            await self._idle.wait()
        # An attempt whose final write is queued is decided by that write, not released.
        remaining = self.inflight.not_finishing()
        count = 0
        with anyio.CancelScope(shield=True):
            if remaining:
                for attempt in remaining:
                    attempt.stop_for(StopReason.RELEASED)
                    attempt.scope.cancel()
                with anyio.move_on_after(10):
                    count = await queries.run_release_many(
                        self.pool,
                        self.clock.sql_now(),
                        [a.run_id for a in remaining],
                        [a.attempt_id for a in remaining],
                        self.worker_id,
                    )
                    await queries.run_notify_ready(self.pool, "released")
                    self.metrics.leases_released.inc(count)
                    # A release whose attempt was no longer current (reaped meanwhile) was
                    # rejected by its guard and handed nothing back.
                    self.metrics.fenced_writes.labels("release").inc(len(remaining) - count)
                    log.info("worker.released", runs=count)
            # The queued final writes land (each batch is bounded by the finalizer).
            with anyio.move_on_after(self.finalizer.write_timeout + 1):
                await self._idle.wait()
        self._update_slot_gauge()
        return count
