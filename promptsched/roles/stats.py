"""The stats role owns the database-derived gauges: the one replica leading the ``stats`` duty
reads queue depth, oldest pending age, stuck runs and outbox depth for the whole fleet."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.metrics import Metrics
from promptsched.roles.loop import Wakeup, run_forever
from promptsched.store import queries

log = structlog.get_logger("stats")

DUTY = "stats"

QUEUE_STATUSES = ("pending", "scheduled", "running")
STUCK_REASONS = ("lease_expired", "deadline_passed")
OUTBOX_STATUSES = ("pending", "sending", "dead")


class Stats:
    """Every ``interval``, the leader renews its term and refreshes the gauges; the other
    replicas try to take the duty and otherwise export no series for those gauges, so N
    replicas cost one replica's queries.

    Leadership is a row in ``leaders`` with an expiry of Postgres's clock, taken and renewed
    by one statement on a pooled connection (docs/deploying.md says why not a session lock):
    it works through a transaction pooler, and a leader that crashed or froze loses the duty
    when its ``term`` runs out without a renewal. The leader believes in its term only until
    ``term`` after it sent the renewal (a local monotonic deadline, never compared with a
    database time); the database's expiry is ``term`` after the renewal arrived, later still.
    So a replica stops calling itself leader before another can take over: never two at once.
    """

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        *,
        holder: str = "promptsched",
        interval: timedelta = timedelta(seconds=5),
        term: timedelta = timedelta(seconds=15),
        query_timeout: timedelta = timedelta(seconds=10),
    ) -> None:
        if term <= interval:
            raise ValueError("the term must outlast the renewal interval")
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        # Unique per process lifetime: a restarted replica never renews its predecessor's term.
        self.holder = f"{holder}/{secrets.token_hex(4)}"
        self.interval = interval
        self.term = term
        self.query_timeout = query_timeout
        self.wakeup = Wakeup()
        self._term_number: int | None = None
        self._believe_until = 0.0  # time.monotonic() deadline of the current term
        self._acquired = False  # ever led: a stop releases the row
        self._clear()
        # Read at scrape time, so a replica whose term ran out (frozen, or its renewals
        # failing) stops saying it leads even before its next tick.
        metrics.stats_leader.set_function(lambda: 1.0 if self.leader else 0.0)

    @property
    def leader(self) -> bool:
        return self._term_number is not None and time.monotonic() < self._believe_until

    async def run_once(self) -> bool:
        """Take or renew the duty and, as leader, refresh the gauges; True while leader."""
        sent = time.monotonic()
        try:
            with anyio.fail_after(self.query_timeout.total_seconds()):
                number = await queries.leader_acquire(
                    self.pool, DUTY, self.holder, self.term, self.clock.sql_now()
                )
                if number is None:
                    self._step_down("taken")
                    return False
                if number != self._term_number:
                    log.info("stats.leader_acquired", holder=self.holder, term=number)
                self._term_number, self._acquired = number, True
                self._believe_until = sent + self.term.total_seconds()
                await self._refresh()
            return self.leader
        except Exception:
            # A renewal that failed may let the term run out: stop exporting now.
            self._step_down("error")
            raise
        except BaseException:
            self._step_down(None)
            raise

    async def close(self) -> None:
        """Step down (releasing the duty for another replica at once) and stop exporting."""
        self._step_down(None)
        if not self._acquired:
            return
        self._acquired = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await queries.leader_release(self.pool, DUTY, self.holder)
            except Exception as exc:  # the term then simply runs out
                log.warning("stats.release_failed", holder=self.holder, error=repr(exc))
            else:
                log.info("stats.leader_released", holder=self.holder)

    def _step_down(self, reason: str | None) -> None:
        if self._term_number is not None and reason is not None:
            log.warning("stats.leader_lost", holder=self.holder, reason=reason)
        self._term_number = None
        self._clear()

    async def _refresh(self) -> None:
        now = self.clock.sql_now()
        async with self.pool.acquire() as conn:
            depth = await queries.stats_queue_depth(conn, now)
            oldest = await queries.stats_oldest_pending(conn, now)
            outbox = await queries.stats_outbox_depth(conn)
        if self.leader:  # still within the term after the queries
            self._publish(depth, oldest, outbox)

    def _publish(
        self,
        depth: asyncpg.Record,
        oldest: Sequence[asyncpg.Record],
        outbox: Sequence[asyncpg.Record],
    ) -> None:
        # No await in here: a scrape sees the previous refresh or this one, never a mix.
        metrics = self.metrics
        for status in QUEUE_STATUSES:
            metrics.queue_depth.labels(status).set(depth[status])
        for reason in STUCK_REASONS:
            metrics.stuck_runs.labels(reason).set(depth[reason])
        metrics.oldest_pending_age.clear()
        for row in oldest:
            metrics.oldest_pending_age.labels(row["provider"]).set(max(0.0, row["age"]))
        counted = {row["status"]: row["count"] for row in outbox}
        for status in OUTBOX_STATUSES:
            metrics.outbox_depth.labels(status).set(counted.get(status, 0))

    def _clear(self) -> None:
        metrics = self.metrics
        for gauge in (
            metrics.queue_depth,
            metrics.oldest_pending_age,
            metrics.stuck_runs,
            metrics.outbox_depth,
        ):
            gauge.clear()

    async def _tick(self) -> float:
        await self.run_once()
        return self.interval.total_seconds()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await run_forever("stats", self._tick, self.wakeup, self.metrics)
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()
