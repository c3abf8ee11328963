"""The stats role owns the database-derived gauges: the one replica holding an advisory lock
reads queue depth, oldest pending age, stuck runs and outbox depth for the whole fleet."""

from __future__ import annotations

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
from promptsched.store import pool as pools
from promptsched.store import queries

log = structlog.get_logger("stats")

# pg_try_advisory_lock key of the stats leader ("psstats" in ASCII).
LOCK_KEY = 0x70_73_73_74_61_74_73

QUEUE_STATUSES = ("pending", "scheduled", "running")
STUCK_REASONS = ("lease_expired", "deadline_passed")
OUTBOX_STATUSES = ("pending", "sending", "dead")


class Stats:
    """Every ``interval``, the leader refreshes the gauges; other replicas try to take the lock
    and otherwise export no series for those gauges, so N replicas cost one replica's queries.

    The lock lives on a dedicated session (never a pooled connection, whose reset would drop
    it), so a crashed leader's lock goes with its connection. The session also gets an
    ``idle_session_timeout``: a frozen leader stops querying and the server ends its session.
    """

    def __init__(
        self,
        dsn: str,
        clock: Clock,
        metrics: Metrics,
        *,
        interval: timedelta = timedelta(seconds=5),
        query_timeout: timedelta = timedelta(seconds=10),
    ) -> None:
        self.dsn = dsn
        self.clock = clock
        self.metrics = metrics
        self.interval = interval
        self.query_timeout = query_timeout
        self.wakeup = Wakeup()
        self.leader = False
        self._conn: asyncpg.Connection[Any] | None = None
        self._clear()

    async def run_once(self) -> bool:
        """Take the lock if free and, as leader, refresh the gauges; True while leader."""
        try:
            with anyio.fail_after(self.query_timeout.total_seconds()):
                conn = await self._connection()
                if not self.leader:
                    self.leader = await queries.stats_leader_try(conn, LOCK_KEY)
                    if self.leader:
                        log.info("stats.leader_acquired")
                if self.leader:
                    await self._refresh(conn)
                else:
                    self._clear()
            return self.leader
        except BaseException:
            # Whatever happened to the session, the lock may be gone with it: start over.
            with anyio.CancelScope(shield=True):
                await self.close()
            raise

    async def close(self) -> None:
        """Close the session (releasing the lock) and stop exporting the gauges."""
        if self.leader:
            log.info("stats.leader_released")
        self.leader = False
        self._clear()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with anyio.move_on_after(5):
                await conn.close()
            if not conn.is_closed():
                conn.terminate()

    async def _connection(self) -> asyncpg.Connection[Any]:
        if self._conn is None or self._conn.is_closed():
            if self.leader:
                log.warning("stats.leader_lost", reason="session closed")
            self.leader = False
            self._clear()
            self._conn = await pools.connect(self.dsn, application_name="promptsched-stats")
            idle = max(timedelta(seconds=30), self.interval * 6)
            await queries.stats_session_setup(self._conn, idle)
        return self._conn

    async def _refresh(self, conn: asyncpg.Connection[Any]) -> None:
        now = self.clock.sql_now()
        depth = await queries.stats_queue_depth(conn, now)
        oldest = await queries.stats_oldest_pending(conn, now)
        outbox = await queries.stats_outbox_depth(conn)
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
        metrics.stats_leader.set(1)

    def _clear(self) -> None:
        metrics = self.metrics
        for gauge in (
            metrics.queue_depth,
            metrics.oldest_pending_age,
            metrics.stuck_runs,
            metrics.outbox_depth,
        ):
            gauge.clear()
        metrics.stats_leader.set(0)

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
