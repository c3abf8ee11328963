"""Heartbeats: batched lease renewals of the attempts this process runs, each renewed when its
lease needs it, and the fence that stops an attempt whose lease was taken from it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.metrics import Metrics
from promptsched.roles.worker.inflight import InFlight, InFlightAttempts, StopReason
from promptsched.store import queries

log = structlog.get_logger("heartbeat")

# A heartbeat's lease of running time is watched in this many steps; a pause of the process
# counts as at most two of them (Heartbeat.run_within_lease).
WATCH_STEPS = 10
# The loop looks this many times per interval and renews the attempts whose last renewal
# (or claim) is at least an interval less one look old: every lease is renewed between 3/4
# of an interval and one interval after the last, as today's wave renewed it at most one
# interval after the last, and an attempt shorter than that is never renewed at all.
LOOKS = 4


class Heartbeat:
    """Renews each in-flight lease once it is an ``interval`` old (at most), in one batched
    statement per look; fences attempts whose row moved on.

    Renewals cost what the leases need: an attempt is renewed about once per interval it
    runs, so calls shorter than the interval (most LLM calls, with the default 10 s) are never
    renewed, however many are in flight. A wave that renewed every lease each interval rewrote
    every in-flight row, so a call of d seconds cost d / interval renewals on average: 4,000
    row updates a 20,000-run drain of 2 s calls (W9)."""

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        *,
        lease: timedelta,
        interval: timedelta,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.lease = lease
        self.interval = interval
        self.inflight = InFlightAttempts()

    def due(self) -> list[InFlight]:
        """The attempts whose lease the next look renews."""
        look = self.interval.total_seconds() / LOOKS
        return self.inflight.renewable(
            time.monotonic() - self.interval.total_seconds() + look + 1e-3
        )

    async def run_once(self, attempts: list[InFlight] | None = None) -> int:
        """Renew ``attempts`` (all renewable ones by default) once; returns how many attempts
        were fenced or told to cancel."""
        if attempts is None:
            attempts = self.inflight.renewable()
        if not attempts:
            return 0
        sent = time.monotonic()
        rows = await queries.run_heartbeat_many(
            self.pool,
            self.clock.sql_now(),
            [a.run_id for a in attempts],
            [a.attempt_id for a in attempts],
            self.lease,
        )
        renewed = {row["id"]: row["cancel_requested"] for row in rows}
        self.metrics.leases_renewed.inc(len(renewed))
        stopped = 0
        for attempt in attempts:
            if not self.inflight.current(attempt):
                continue  # finished while the heartbeat was in flight
            if attempt.run_id not in renewed:
                if attempt.finishing:
                    continue  # most likely our own finish landed first; it learns either way
                stopped += 1
                self.metrics.fenced_writes.labels("heartbeat").inc()
                self.fence(attempt, "lease_lost")
                continue
            attempt.renewed_at = sent
            if renewed[attempt.run_id] and attempt.stop_for(StopReason.CANCEL_REQUESTED):
                stopped += 1
                log.info(
                    "attempt.cancel_requested",
                    run_id=attempt.run_id,
                    schedule_id=attempt.schedule_id,
                    attempt_id=str(attempt.attempt_id),
                    worker_id=attempt.worker_id,
                )
                attempt.interrupt()
        return stopped

    def fence(self, attempt: InFlight, reason: str) -> None:
        """The attempt lost its lease: stop it locally; it must write nothing more.

        Counts the lease lost, by cause; the write that found out (if any) counts itself in
        ``fenced_writes``: a lease is lost once, however many writes it rejects.
        """
        if not attempt.stop_for(StopReason.FENCED):
            return
        if reason == "heartbeat_unreachable":
            cause = "unreachable"
        elif time.monotonic() - attempt.renewed_at > self.lease.total_seconds():
            cause = "expired"
        else:
            cause = "taken"
        self.metrics.leases_lost.labels(cause).inc()
        log.warning(
            "attempt.fenced",
            run_id=attempt.run_id,
            schedule_id=attempt.schedule_id,
            attempt_id=str(attempt.attempt_id),
            worker_id=attempt.worker_id,
            reason=reason,
            cause=cause,
        )
        attempt.interrupt()

    async def run_within_lease(self, attempts: list[InFlight] | None = None) -> None:
        """``run_once``, given a lease of this process's own running time to answer, then a
        TimeoutError: a database that hangs (a partition dropping packets) is as unreachable
        as one that refuses, not a 60 s command timeout later.

        Running time, not wall time: a pause of the whole process (SIGSTOP, a paused VM, a
        loop held by a computation) is not the database's. A heartbeat in flight when the
        process stopped would otherwise time out the moment it resumed, its answer already
        in the socket, and call the database unreachable; given its time, it reads that
        answer and learns what happened to the lease (``expired``, a fenced heartbeat).
        """
        budget = self.lease.total_seconds()
        step = budget / WATCH_STEPS
        answered = False
        failed: Exception | None = None  # raised as itself, not inside a task group's group
        with anyio.CancelScope() as bound:

            async def watch() -> None:
                ran = 0.0
                while ran < budget:
                    started = time.monotonic()
                    await anyio.sleep(step)
                    # A step that took over twice as long as asked is the process standing
                    # still (stopped, or its loop held): it counts as two, however long.
                    ran += min(time.monotonic() - started, 2 * step)
                bound.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                try:
                    await self.run_once(attempts)
                    answered = True
                except Exception as exc:
                    failed = exc
                tg.cancel_scope.cancel()
        if failed is not None:
            raise failed
        if not answered:
            raise TimeoutError(f"no answer within a lease ({budget:g} s of running time)")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failures = 0
        while True:
            await anyio.sleep(self.interval.total_seconds() / LOOKS)
            due = self.due()
            if not due:
                continue
            try:
                await self.run_within_lease(due)
                failures = 0
            except Exception as exc:  # any failure (asyncpg raises more than PostgresError)
                # Keep trying: the lease is still ours until it expires. The reaper on another
                # replica decides when it is gone; our next successful heartbeat learns it.
                failures += 1
                self.metrics.role_errors.labels("heartbeat").inc()
                log.warning("heartbeat.failed", error=repr(exc), failures=failures)
                # An attempt whose lease has passed unrenewed: whatever it writes will be
                # fenced, and another replica may already run it. Stop it cleanly (a finish
                # in flight is guarded by itself).
                expired = time.monotonic() - self.lease.total_seconds()
                for attempt in self.inflight.not_finishing():
                    if attempt.renewed_at < expired:
                        self.fence(attempt, "heartbeat_unreachable")
