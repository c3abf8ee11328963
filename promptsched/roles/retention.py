"""History retention: finished runs older than the configured retention are deleted in small
batches, so the runs table stays bounded however long the service lives."""

from __future__ import annotations

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

log = structlog.get_logger("retention")


class Retention:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        *,
        retention: timedelta,
        batch: int = 1000,
        interval: timedelta = timedelta(minutes=1),
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.retention = retention
        self.batch = batch
        self.interval = interval
        self.wakeup = Wakeup()

    async def run_once(self) -> int:
        """Delete one batch; returns how many runs went."""
        purged = await queries.run_purge_finished(
            self.pool, self.clock.sql_now(), self.retention, self.batch
        )
        if purged:
            self.metrics.runs_purged.inc(purged)
            log.info("runs.purged", runs=purged, retention=str(self.retention))
        return purged

    async def _tick(self) -> float:
        purged = await self.run_once()
        # A full batch means more is due: keep going, yielding between batches.
        return 0.0 if purged >= self.batch else self.interval.total_seconds()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await run_forever("retention", self._tick, self.wakeup, self.metrics)
