"""The worker pool owns work: it claims runs into its slots, starts each attempt
(``runner.AttemptRunner``) as a task of its own, and drains: the slots, the claims and the
lifecycle; the attempt's way from executor to final write is the runner's."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.config import WorkerSettings
from promptsched.domain import ClaimedRun
from promptsched.executors.base import Registry
from promptsched.executors.limiter import Limiter
from promptsched.metrics import Children, Metrics
from promptsched.roles.loop import Rush, Wakeup, run_forever
from promptsched.roles.worker.finalizer import Finalizer
from promptsched.roles.worker.fleet import Fleet
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.roles.worker.inflight import InFlight, InFlightAttempts, StopReason
from promptsched.roles.worker.runner import AttemptRunner
from promptsched.roles.worker.waiting import Waiting
from promptsched.store import queries

log = structlog.get_logger("worker")

# At most this many runs per claim: at 5,000 slots one claim took 5,000 runs, and starting
# them (decoding the rows, then each attempt's first steps up to its request, all in the next
# turn of the event loop) held the loop for half a second (W9, docs/performance.md); 256 are
# a few tens of milliseconds.
CLAIM_MAX = 256


def default_worker_id() -> str:
    """This process's name without ``PROMPTSCHED_WORKER_ID``: host, a random part and the pid
    (last, where scripts read it), so two containers on host networking (one host name, both
    pid 1) still differ."""
    return f"{socket.gethostname()}:{secrets.token_hex(3)}:{os.getpid()}"


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
        self.limiters = dict(limiters)
        self.heartbeat = heartbeat
        # One registry of the attempts in flight, shared with the heartbeat that renews them.
        self.inflight: InFlightAttempts = heartbeat.inflight
        self.slots = settings.slots
        self.worker_id = settings.worker_id or default_worker_id()
        self.finalizer = Finalizer(pool, clock, self.worker_id, metrics)
        self.wakeup = Wakeup()
        self.claiming = True
        # Attempts whose executor is running. An attempt whose final write is queued still
        # holds its lease (it stays in ``inflight``, heartbeats go on) but not a slot, so the
        # next claim overlaps the previous batch's write.
        self._executing = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        # Metric children resolved once: a label lookup per run adds up at thousands of runs/s.
        self._busy_gauge = metrics.worker_slots.labels("busy")
        self._idle_gauge = metrics.worker_slots.labels("idle")
        self._child = Children()
        self.fleet = Fleet(pool, clock, metrics, self._child, self.limiters)
        self.waiting = Waiting(pool, clock, self.limiters, self.fleet, settings.max_sleep)
        self.attempts = AttemptRunner(
            pool, clock, metrics, registry, self.limiters, heartbeat, self.finalizer, self.fleet,
            self._child, settings, self.worker_id, self._forget, self.waiting.requeued,
        )  # fmt: skip
        self._update_slot_gauge()

    def notify(self, _payload: str | None = None) -> None:
        self.waiting.clear()
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
            want = min(self._free_slots(), limiter.available(), CLAIM_MAX)
            if want <= 0 or self.waiting.skipped(provider):
                continue
            if limiter.fleet:
                # Enough of this process's returned calls for the claim to take ``want`` when
                # only they fill the limit: the claim's lookups stay the size of a claim.
                excess = max(0, len(self.inflight) - limiter.max_concurrency)
                returned = self.inflight.finishing(provider, want + excess)
                rows = await self.fleet.claim(
                    provider, want, self.worker_id, self.heartbeat.lease, returned
                )
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
            if self.waiting.claimed(provider, rows, want):
                await self.waiting.drain(provider)
            if rows:
                self._idle = anyio.Event()
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
        if self.fleet.moved:  # runs went on to a fallback: claim them without waiting
            self.fleet.moved = 0
            self.waiting.clear()
            self.wakeup.set()
        self._update_slot_gauge()
        return started

    def _count_claim(self, claim: queries.Claim) -> None:
        """One result per claim: contended when runs it wanted and could have taken were held
        by another claimer (SKIP LOCKED passed them over), whatever it got besides; a run
        waiting for its own schedule's predecessor could not be taken and is no contention."""
        result = "contended" if claim.contended else "claimed" if claim else "empty"
        self._child(self.metrics.claims, result).inc()

    async def seconds_until_work(self) -> float:
        return await self.waiting.seconds_until_work(self._free_slots())

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
            submitted = await self.attempts.run(row, attempt)
        finally:
            self._executing -= 1
            if not submitted:
                self._forget(attempt)
            self.wakeup.set()  # a slot is free: the dispatcher claims (and updates the gauge)

    def _forget(self, attempt: InFlight) -> None:
        """The attempt is over for this process: no more heartbeats, its lease is not ours."""
        # Its permit went back when its call returned (AttemptRunner.run), unless it never
        # made one (stopped before, or cancelled on the way).
        if attempt.permit is not None:
            attempt.permit.release()
        self.inflight.discard(attempt)
        if not self.inflight:
            self._idle.set()
        self.wakeup.set()

    # --- lifecycle ------------------------------------------------------------------------

    async def run_once(self) -> int:
        """Drain mode: claim and execute everything due now, then return the number run."""
        total = 0
        self.waiting.clear()
        try:
            async with anyio.create_task_group() as tg:
                self.attempts.tg = tg
                await tg.start(self.finalizer.run)
                while True:
                    # Done only when a claim that began with nothing in flight found nothing:
                    # an attempt finishing during the claim's awaits may have freed a limit.
                    idle_before = not self.inflight
                    started = await self.claim()
                    total += started
                    if started == 0 and idle_before and not self.inflight:
                        break
                    if started == 0:
                        self.waiting.clear()  # the next claim asks every provider again
                    await self.wakeup.wait(0.05 if started == 0 else 0)
                tg.cancel_scope.cancel()
        finally:
            await self._stop_attempts()
        return total

    async def _dispatch_once(self) -> float:
        """Claim what can be claimed; how long to wait before the next claim."""
        started = await self.claim()
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
                self.attempts.tg = tg
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
                    attempt.interrupt()
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
