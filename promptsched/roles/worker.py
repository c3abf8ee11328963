"""The worker pool owns work: it claims runs, executes them under a lease and a timeout, and
finalizes each attempt conditioned on its fencing token."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup, TaskStatus

from promptsched.clock import Clock
from promptsched.errors import (
    AttemptTimeout,
    ExecutorError,
    PermanentError,
    RetryableError,
    ValidationError,
)
from promptsched.executors import template
from promptsched.executors.base import ExecutionRequest, ExecutionResult, Registry
from promptsched.executors.limiter import Limiter
from promptsched.metrics import Metrics
from promptsched.roles import autopause
from promptsched.roles.finalizer import Finalizer
from promptsched.roles.heartbeat import Heartbeat, InFlight
from promptsched.roles.loop import Wakeup
from promptsched.roles.transcript import AttemptLog
from promptsched.schedule.backoff import RetryPolicy, decide
from promptsched.store import queries

log = structlog.get_logger("worker")


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
        *,
        slots: int,
        worker_id: str,
        retry_base: timedelta = timedelta(seconds=2),
        retry_max: timedelta = timedelta(hours=1),
        max_sleep: timedelta = timedelta(seconds=5),
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.registry = registry
        self.limiters = dict(limiters)
        self.heartbeat = heartbeat
        self.finalizer = Finalizer(pool, clock)
        self.slots = slots
        self.worker_id = worker_id
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.max_sleep = max_sleep
        self.wakeup = Wakeup()
        self.claiming = True
        self._blocked_backoff = 0.0
        self._idle = anyio.Event()
        self._idle.set()
        self._update_slot_gauge()

    @property
    def inflight(self) -> dict[int, InFlight]:
        return self.heartbeat.inflight

    def notify(self, _payload: str | None = None) -> None:
        self.wakeup.set()

    def _update_slot_gauge(self) -> None:
        busy = len(self.inflight)
        self.metrics.worker_slots.labels("busy").set(busy)
        self.metrics.worker_slots.labels("idle").set(max(0, self.slots - busy))

    # --- claiming -------------------------------------------------------------------------

    async def claim(self, tg: TaskGroup) -> int:
        """Claim as many runs as free slots and provider limits allow; start each in ``tg``."""
        started = 0
        for provider, limiter in self.limiters.items():
            want = min(self.slots - len(self.inflight), limiter.available())
            if want <= 0:
                continue
            rows = await queries.run_claim_batch(
                self.pool,
                self.clock.sql_now(),
                provider,
                want,
                self.worker_id,
                self.heartbeat.lease,
            )
            await self._count_claim(provider, want, len(rows))
            for row in rows:
                permit = limiter.try_acquire()
                attempt = InFlight(
                    row["id"],
                    row["attempt_id"],
                    provider,
                    permit,
                    row["schedule_id"],
                    self.worker_id,
                )
                self.inflight[row["id"]] = attempt
                self._idle = anyio.Event()
                tg.start_soon(self._execute, row, attempt)
                started += 1
        self._update_slot_gauge()
        return started

    async def _count_claim(self, provider: str, wanted: int, got: int) -> None:
        if got:
            self.metrics.claims.labels("claimed").inc()
            return
        # Nothing claimed: was the work simply not there, or did another replica hold it?
        ahead = await queries.run_seconds_until_available(
            self.pool, self.clock.sql_now(), [provider]
        )
        self.metrics.claims.labels(
            "contended" if ahead is not None and ahead <= 0 else "empty"
        ).inc()

    async def seconds_until_work(self) -> float:
        cap = self.max_sleep.total_seconds()
        if len(self.inflight) >= self.slots:
            return cap  # a finishing attempt wakes us
        ready = [p for p, limiter in self.limiters.items() if limiter.available() > 0]
        rate_waits = [limiter.seconds_until_available() for limiter in self.limiters.values()]
        if not ready:
            return max(0.0, min([cap, *rate_waits]))
        ahead = await queries.run_seconds_until_available(self.pool, self.clock.sql_now(), ready)
        if ahead is not None and ahead <= 0:
            # Available work we could not claim: another replica holds it, or a serial run
            # waits for its predecessor. Back off (50 ms doubling to 1 s) rather than spin.
            self._blocked_backoff = min(1.0, max(0.05, self._blocked_backoff * 2))
            return self._blocked_backoff
        self._blocked_backoff = 0.0
        return cap if ahead is None else min(cap, ahead)

    # --- executing ------------------------------------------------------------------------

    async def _execute(self, row: asyncpg.Record, attempt: InFlight) -> None:
        bound = log.bind(
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            attempt_id=str(row["attempt_id"]),
            worker_id=self.worker_id,
        )
        self.metrics.start_lag.observe(max(0.0, row["start_lag"]))
        started = anyio.current_time()
        outcome: ExecutionResult | ExecutorError | None = None
        try:
            if not row["enabled"]:
                await self._finish(
                    attempt,
                    row,
                    bound,
                    status="skipped",
                    attempt_status="skipped",
                    skip_reason="disabled",
                )
                self.metrics.dropped_ticks.labels("disabled").inc()
                return
            bound.debug("attempt.started", attempt=row["attempts"], provider=attempt.provider)
            with attempt.scope:
                outcome = await self._call_executor(row, attempt)
            duration = anyio.current_time() - started
            await self._settle(row, attempt, outcome, duration, bound)
        finally:
            if attempt.permit is not None:
                attempt.permit.release()
            self.inflight.pop(attempt.run_id, None)
            self._update_slot_gauge()
            if not self.inflight:
                self._idle.set()
            self.wakeup.set()

    async def _render(self, row: asyncpg.Record) -> tuple[str, dict[str, Any]]:
        """The prompt and params of this attempt, templates filled in from the run context."""
        params = dict(row["params"] or {})
        system = params.get("system")
        texts = {
            "prompt": row["prompt"],
            "params.system": system if isinstance(system, str) else "",
        }
        used = {v for field, t in texts.items() for v in template.variables_used(t, field=field)}
        previous = None
        if any(v.startswith("previous_") for v in used):
            previous = await queries.run_previous_success(
                self.pool, row["schedule_id"], row["slot"]
            )
        context = template.build_context(
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            schedule_name=row["name"],
            slot=row["slot"],
            timezone=row["timezone"],
            previous_run_at=previous["finished_at"] if previous else None,
            previous_output=previous["output"] if previous else None,
        )
        prompt = template.render(row["prompt"], context)
        if isinstance(system, str):  # a system prompt is a template too
            params["system"] = template.render(system, context, field="params.system")
        return prompt, params

    async def _call_executor(
        self, row: asyncpg.Record, attempt: InFlight
    ) -> ExecutionResult | ExecutorError:
        try:
            prompt, params = await self._render(row)
        except ValidationError as exc:
            return PermanentError(f"bad prompt template: {exc}")
        except Exception as exc:  # the database failed mid-read (asyncpg raises more than
            # PostgresError when a connection dies): this attempt fails, the worker lives on
            return RetryableError(f"could not read the run's context: {exc!r}")
        request = ExecutionRequest(
            run_id=row["id"],
            schedule_id=row["schedule_id"],
            schedule_name=row["name"],
            attempt_id=row["attempt_id"],
            attempt=row["attempts"],
            slot=row["slot"],
            timezone=row["timezone"],
            prompt=prompt,
            model=row["model"],
            params=params,
            timeout=row["timeout_seconds"],
            progress=AttemptLog(
                self.pool, self.clock, self.metrics,
                run_id=row["id"], attempt_id=row["attempt_id"], attempt=row["attempts"],
            ).record,
        )  # fmt: skip
        timeout = row["timeout_seconds"]
        try:
            with anyio.fail_after(timeout):
                return await self.registry.get(attempt.provider).execute(request)
        except TimeoutError:
            return AttemptTimeout(f"timed out after {timeout:g}s")
        except ExecutorError as exc:
            return exc
        except Exception as exc:  # an executor bug must not take down the worker slot
            log.exception(
                "attempt.executor_crashed",
                run_id=row["id"],
                schedule_id=row["schedule_id"],
                attempt_id=str(row["attempt_id"]),
                worker_id=self.worker_id,
            )
            return RetryableError(f"executor crashed: {exc!r}")

    async def _settle(
        self,
        row: asyncpg.Record,
        attempt: InFlight,
        outcome: ExecutionResult | ExecutorError | None,
        duration: float,
        bound: Any,
    ) -> None:
        if attempt.fenced or attempt.released:
            return  # the lease is gone: this attempt writes nothing
        provider = attempt.provider
        if attempt.cancel_requested or outcome is None:
            self.metrics.run_duration.labels(provider, "cancelled").observe(duration)
            await self._finish(
                attempt,
                row,
                bound,
                status="cancelled",
                attempt_status="cancelled",
                error="cancelled while running",
            )
            return
        if isinstance(outcome, ExecutionResult):
            self.metrics.run_duration.labels(provider, "succeeded").observe(duration)
            await self._finish(
                attempt,
                row,
                bound,
                status="succeeded",
                attempt_status="succeeded",
                output=outcome.output,
                usage=dict(outcome.usage) if outcome.usage else None,
            )
            return
        self.metrics.run_duration.labels(provider, "failed").observe(duration)
        decision = decide(
            retryable=outcome.retryable,
            retry_after=outcome.retry_after,
            attempt=row["attempts"] - row["releases"],
            policy=RetryPolicy(row["max_attempts"], self.retry_base, self.retry_max),
            jitter=random.random(),
        )
        if decision.action == "retry":
            self.metrics.retries.labels(provider).inc()
            await self._finish(
                attempt,
                row,
                bound,
                status="pending",
                attempt_status="failed",
                error=outcome.message,
                retry_in=decision.delay,
            )
        else:
            self.metrics.dead_letters.labels(provider).inc()
            await self._finish(
                attempt, row, bound, status="dead", attempt_status="failed", error=outcome.message
            )

    async def _finish(
        self, attempt: InFlight, row: asyncpg.Record, bound: Any, **fields: Any
    ) -> None:
        attempt.finishing = True  # from here on the write's own guard fences, not the heartbeat
        # Shielded: a shutdown must not cut the final write in half.
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            try:
                landed = await self.finalizer.finish(
                    queries.Finish(run_id=row["id"], attempt_id=row["attempt_id"], **fields)
                )
            except Exception as exc:  # the database is unreachable: never take the pool down
                # Whether the write landed is unknown. If not, the run keeps our lease until it
                # expires (this attempt no longer heartbeats) and the reaper decides.
                self.metrics.role_errors.labels("worker").inc()
                bound.warning("attempt.finalize_failed", status=fields["status"], error=repr(exc))
                return
            if landed:
                if fields["status"] != "pending":
                    self.metrics.runs_finished.labels(fields["status"]).inc()
                if fields["status"] == "dead":
                    try:
                        await autopause.check(
                            self.pool, row["schedule_id"], row["id"], self.clock.sql_now()
                        )
                    except Exception as exc:  # the run is dead already; its next death checks
                        self.metrics.role_errors.labels("worker").inc()
                        bound.warning("autopause.check_failed", error=repr(exc))
                bound.info(
                    f"run.{fields['status']}",
                    attempt=row["attempts"],
                    error=fields.get("error"),
                    retry_in=str(fields["retry_in"]) if "retry_in" in fields else None,
                )
            else:
                self.heartbeat.fence(attempt, "finalize_rejected")

    # --- lifecycle ------------------------------------------------------------------------

    async def run_once(self) -> int:
        """Drain mode: claim and execute everything due now, then return the number run."""
        total = 0
        async with anyio.create_task_group() as tg:
            while True:
                # Done only when a claim that began with nothing in flight found nothing: an
                # attempt finishing during the claim's awaits may have freed a provider limit.
                idle_before = not self.inflight
                started = await self.claim(tg)
                total += started
                if started == 0 and idle_before and not self.inflight:
                    break
                await self.wakeup.wait(0.05 if started == 0 else 0)
        return total

    async def _dispatch(self, tg: TaskGroup) -> None:
        failures = 0
        while self.claiming:
            try:
                started = await self.claim(tg)
                if started:
                    self._blocked_backoff = 0.0
                delay = 0.0 if started else await self.seconds_until_work()
                failures = 0
            except Exception as exc:  # asyncpg raises more than PostgresError on a dying
                # connection (InternalClientError after a server shutdown); never crash the pool
                failures += 1
                self.metrics.role_errors.labels("worker").inc()
                delay = min(10.0, 0.1 * 2 ** min(failures, 10))
                log.warning("worker.claim_failed", error=repr(exc), retry_in=delay)
            if self.claiming:
                await self.wakeup.wait(delay)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.heartbeat.run)
            task_status.started()
            await self._dispatch(tg)
            await self._idle.wait()
            tg.cancel_scope.cancel()

    async def drain(self, grace: timedelta) -> int:
        """Stop claiming, let in-flight attempts finish for ``grace``, then hand the rest back
        at once so another replica claims them without waiting for the lease to expire."""
        self.claiming = False
        self.wakeup.set()
        with anyio.move_on_after(grace.total_seconds()):
            await self._idle.wait()
        remaining = list(self.inflight.values())
        if not remaining:
            return 0
        for attempt in remaining:
            attempt.released = True
            attempt.scope.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            count = await queries.run_release_many(
                self.pool,
                self.clock.sql_now(),
                [a.run_id for a in remaining],
                [a.attempt_id for a in remaining],
            )
            await queries.run_notify_ready(self.pool, "released")
            self.metrics.leases_released.inc(count)
            log.info("worker.released", runs=count)
            return count
        return 0
