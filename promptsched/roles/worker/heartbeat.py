"""Heartbeats: one batched lease renewal for every attempt this process runs, and the fence
that stops an attempt whose lease was taken from it."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum
from typing import Any
from uuid import UUID

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.executors.limiter import Permit
from promptsched.metrics import Metrics
from promptsched.store import queries

log = structlog.get_logger("heartbeat")

# A heartbeat's lease of running time is watched in this many steps; a pause of the process
# counts as at most two of them (Heartbeat.run_within_lease).
WATCH_STEPS = 10


class StopReason(IntEnum):
    """Why an attempt stops before its executor's outcome is written; one per attempt.

    Ordered by precedence: a stronger reason replaces a weaker one, never the reverse. A lease
    that is lost (FENCED) or handed back on drain (RELEASED) means the attempt writes nothing,
    whatever else happened; a cancel asked for by the run's owner (CANCEL_REQUESTED) ends it
    ``cancelled`` only while the lease is still ours. A heartbeat skips FENCED attempts, so
    nothing follows FENCED; RELEASED can still be fenced by a heartbeat racing the release.
    """

    NONE = 0
    CANCEL_REQUESTED = 1
    RELEASED = 2
    FENCED = 3

    @property
    def writes_nothing(self) -> bool:
        return self >= StopReason.RELEASED


@dataclass(eq=False, slots=True)
class InFlight:
    """One attempt running in this process."""

    run_id: int
    attempt_id: UUID
    provider: str
    permit: Permit | None
    schedule_id: int = 0
    worker_id: str = ""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stop: StopReason = StopReason.NONE
    # Its final write is on the way: that write's own guard decides, so a heartbeat that finds
    # the row moved on (by this very write) must not count it as fenced. A phase, not a stop
    # reason: a finishing attempt can still be fenced (its write rejected) or asked to cancel.
    finishing: bool = False
    # Monotonic time the lease was last known to start (the claim, then each renewal sent):
    # a lease lost longer than a lease after it expired; one lost sooner was taken.
    renewed_at: float = field(default_factory=time.monotonic)
    # Token usage its agent steps reported so far: what a failed or timed-out attempt spent.
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def fenced(self) -> bool:
        return self.stop is StopReason.FENCED

    @property
    def stopped(self) -> bool:
        return self.stop is not StopReason.NONE

    def stop_for(self, reason: StopReason) -> bool:
        """Record ``reason`` unless an equal or stronger one is recorded; True when recorded."""
        if reason <= self.stop:
            return False
        self.stop = reason
        return True


class InFlightAttempts(Mapping[int, InFlight]):
    """The one owner of this process's in-flight attempts, by run id.

    The pool adds an attempt on claim and discards it once it is over for this process; the
    heartbeat renews and fences what is here; drain releases what is here and not finishing.
    Read-only as a mapping; changed only through ``add`` and ``discard``.
    """

    def __init__(self) -> None:
        self._by_run: dict[int, InFlight] = {}

    def __getitem__(self, run_id: int) -> InFlight:
        return self._by_run[run_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_run)

    def __len__(self) -> int:
        return len(self._by_run)

    def add(self, attempt: InFlight) -> None:
        self._by_run[attempt.run_id] = attempt

    def discard(self, attempt: InFlight) -> None:
        """Forget ``attempt`` if it is still the one in flight for its run. A fenced attempt
        that winds down after this process claimed the same run again must not take the new
        attempt out of the registry (it would stop renewing a lease it holds)."""
        if self._by_run.get(attempt.run_id) is attempt:
            del self._by_run[attempt.run_id]

    def current(self, attempt: InFlight) -> bool:
        """Whether ``attempt`` is still the one in flight for its run."""
        return self._by_run.get(attempt.run_id) is attempt

    def renewable(self) -> list[InFlight]:
        """Attempts with a lease to renew: a fenced one has nothing left, it only waits to stop."""
        return [a for a in self._by_run.values() if not a.fenced]

    def not_finishing(self) -> list[InFlight]:
        """Attempts whose final write is not queued (that write's own guard decides the rest)."""
        return [a for a in self._by_run.values() if not a.finishing]


class Heartbeat:
    """Renews every in-flight lease each ``interval``; fences attempts whose row moved on."""

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

    async def run_once(self) -> int:
        """Renew all leases once; returns how many attempts were fenced or told to cancel."""
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
                attempt.scope.cancel()
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
        attempt.scope.cancel()

    async def run_within_lease(self) -> None:
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
                    await self.run_once()
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
        last_ok = time.monotonic()
        while True:
            await anyio.sleep(self.interval.total_seconds())
            try:
                await self.run_within_lease()
                failures = 0
                last_ok = time.monotonic()
            except Exception as exc:  # any failure (asyncpg raises more than PostgresError)
                # Keep trying: the lease is still ours until it expires. The reaper on another
                # replica decides when it is gone; our next successful heartbeat learns it.
                failures += 1
                self.metrics.role_errors.labels("heartbeat").inc()
                log.warning("heartbeat.failed", error=repr(exc), failures=failures)
                if time.monotonic() - last_ok > self.lease.total_seconds():
                    # Our leases have expired by now: whatever we write will be fenced, and
                    # another replica may already run these attempts. Stop them cleanly.
                    # a finish in flight is guarded by itself
                    for attempt in self.inflight.not_finishing():
                        self.fence(attempt, "heartbeat_unreachable")
