"""The worker pool owns work: it claims runs into its slots, starts each attempt
(``runner.AttemptRunner``) as a task of its own, and drains: the slots, the claims and the
lifecycle; the attempt's way from executor to final write is the runner's."""

from __future__ import annotations

import asyncio
import os
import socket
import time
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
        self.max_sleep = settings.max_sleep
        self.wakeup = Wakeup()
        # Providers whose last claim took all they had, and when (monotonic) their next run
        # becomes available (max_sleep ahead when none is pending): not asked again before
        # then unless a NOTIFY says runs were written. A claim of the unused `echo` ran beside
        # every claim of a busy provider, one round trip each.
        self._drained: dict[str, float] = {}
        self.claiming = True
        self._blocked_backoff = 0.0
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
        self.attempts = AttemptRunner(
            pool, clock, metrics, registry, self.limiters, heartbeat, self.finalizer, self.fleet,
            self._child, settings, self.worker_id, self._forget,
        )  # fmt: skip
        self._update_slot_gauge()

    def notify(self, _payload: str | None = None) -> None:
        self._drained.clear()
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
            if want <= 0 or self._drained.get(provider, 0.0) > time.monotonic():
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
            if len(rows) < want and rows.claimable <= len(rows):
                await self._drain(provider)  # it took all there was (none held by others)
            else:
                self._drained.pop(provider, None)
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
        if self.fleet.moved:  # runs went on to a fallback: claim them without waiting
            self.fleet.moved = 0
            self._drained.clear()
            self.wakeup.set()
        self._update_slot_gauge()
        return started

    async def _drain(self, provider: str) -> None:
        """Leave ``provider`` out of the claims until its next pending run is available."""
        ahead = await queries.run_seconds_until_available(
            self.pool, self.clock.sql_now(), [provider]
        )
        wait = self.max_sleep.total_seconds() if ahead is None else max(0.0, ahead)
        self._drained[provider] = time.monotonic() + wait

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
        now = time.monotonic()
        ready = [
            p
            for p, limiter in self.limiters.items()
            if limiter.available() > 0 and self._drained.get(p, 0.0) <= now
        ]
        rate_waits = [  # a provider at its limit: until its next permit or rate token
            limiter.seconds_until_available()
            for limiter in self.limiters.values()
            if limiter.available() <= 0
        ]
        # A provider left out of the claims is asked again when its next run is available.
        cap = min([cap, *(until - now for until in self._drained.values() if until > now)])
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
            submitted = await self.attempts.run(row, attempt)
        finally:
            self._executing -= 1
            if not submitted:
                self._forget(attempt)
            self.wakeup.set()  # a slot is free: the dispatcher claims (and updates the gauge)

    def _forget(self, attempt: InFlight) -> None:
        """The attempt is over for this process: no more heartbeats, its lease is not ours."""
        # A fleet-limited provider's permit is held until here, not just while the executor
        # runs: the fleet counts the run in flight until its final write commits, so a permit
        # given back sooner only made the next claim find no room. A provider limited in this
        # process only gave its permit back when its call returned (AttemptRunner.run).
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
        self._drained.clear()
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
                        self._drained.clear()  # the next claim asks every provider again
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
