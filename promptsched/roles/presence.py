"""The presence role: every replica publishes its configuration (no secret in it) and a
fingerprint of it to the ``replicas`` table when it starts and every interval after, with the
attempts it runs; it reads back how many live replicas publish which fingerprint, for the
drift gauges, and says at a clean stop that it is gone."""

from __future__ import annotations

from collections.abc import Callable
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

log = structlog.get_logger("presence")

# A replica is alive until this many intervals pass without a renewal (a crash, a freeze).
ALIVE_INTERVALS = 3


class Presence:
    """``describe`` gives what to publish now (the tool catalog may change while it runs);
    ``in_flight`` the attempts this process runs now."""

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        *,
        describe: Callable[[], queries.ReplicaRow],
        in_flight: Callable[[], int],
        interval: timedelta = timedelta(seconds=10),
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.describe = describe
        self.in_flight = in_flight
        self.interval = interval
        self.wakeup = Wakeup()
        self._published = False
        self._skip_tick = False  # the first tick of the loop follows run()'s own publish
        self._drift: bool | None = None
        replica = describe()
        self.replica_id = replica.id
        metrics.config_info.labels(replica.version, replica.fingerprint).set(1)

    async def run_once(self) -> int:
        """Publish this replica's row, then read the fleet's fingerprints; returns how many
        different ones the live replicas publish (1: they agree)."""
        replica = self.describe()
        now = self.clock.sql_now()
        alive_for = self.interval * ALIVE_INTERVALS
        await queries.replica_publish(self.pool, replica, self.in_flight(), alive_for, now)
        self._published = True
        found = await queries.replica_fingerprints(self.pool, now)
        distinct = len(found)
        self.metrics.replicas.set(sum(row["replicas"] for row in found))
        self.metrics.config_fingerprints.set(distinct)
        self.metrics.config_drift.set(1 if distinct > 1 else 0)
        drift = distinct > 1
        if drift != self._drift:
            if drift:
                shares = {row["fingerprint"]: row["replicas"] for row in found}
                log.warning("fleet.config_drift", fingerprint=replica.fingerprint, fleet=shares)
            elif self._drift is not None:
                log.info("fleet.config_agrees", fingerprint=replica.fingerprint)
            self._drift = drift
        return distinct

    async def close(self) -> None:
        """Say this replica is gone, so it leaves the fleet at once, not when it times out."""
        if not self._published:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await queries.replica_stop(self.pool, self.replica_id, self.clock.sql_now())
            except Exception as exc:  # its row then simply times out
                log.warning("presence.stop_failed", replica=self.replica_id, error=repr(exc))

    async def _tick(self) -> float:
        if self._skip_tick:
            self._skip_tick = False
        else:
            await self.run_once()
        return self.interval.total_seconds()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Published once before it reports started: a replica that is up is in the table."""
        try:
            await self.run_once()
            self._skip_tick = True
        except Exception as exc:  # the loop below retries at once; the replica still starts
            self.metrics.role_errors.labels("presence").inc()
            log.warning("role.error", role="presence", error=repr(exc))
        task_status.started()
        try:
            await run_forever("presence", self._tick, self.wakeup, self.metrics)
        finally:
            await self.close()
