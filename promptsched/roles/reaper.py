"""The reaper owns leases: a run whose lease expired goes back to pending (its attempt marked
lost) or to dead when its attempts are used up; a run far past its deadline likewise."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.config import ReaperSettings
from promptsched.domain import RunStatus
from promptsched.metrics import Metrics
from promptsched.roles import autopause
from promptsched.roles.loop import Wakeup, run_forever
from promptsched.store import queries

log = structlog.get_logger("reaper")

# The leases_reaped / runs_finished label of a reaped run's new status (pending: "retry").
_REAP_OUTCOMES = {RunStatus.DEAD: "dead", RunStatus.CANCELLED: "cancelled"}


class Reaper:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        settings: ReaperSettings,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        # The worker enforces the timeout itself; the reaper steps in only after this grace.
        self.deadline_grace = settings.deadline_grace
        self.batch = settings.batch
        self.max_sleep = settings.max_sleep
        self.wakeup = Wakeup()

    async def run_once(self) -> Counter[str]:
        """Reap every expired lease; returns counts by the run's new status."""
        counts: Counter[str] = Counter()
        while True:
            rows = await queries.run_reap_expired(
                self.pool, self.clock.sql_now(), self.batch, self.deadline_grace
            )
            for row in rows:
                outcome = _REAP_OUTCOMES.get(row.status, "retry")
                counts[row.status] += 1
                self.metrics.leases_reaped.labels(outcome).inc()
                if row.status is RunStatus.CANCELLED:
                    self.metrics.runs_finished.labels(outcome).inc()
                if row.status is RunStatus.DEAD:
                    self.metrics.runs_finished.labels(outcome).inc()
                    self.metrics.dead_letters.labels(row.provider).inc()
                    await autopause.check(self.pool, row.schedule_id, row.id, self.clock.sql_now())
                log.warning(
                    "run.reaped",
                    run_id=row.id,
                    schedule_id=row.schedule_id,
                    attempt_id=str(row.attempt_id),
                    worker_id=row.worker_id,
                    status=row.status,
                    lease_lost=row.lease_lost,
                )
            if counts[RunStatus.PENDING]:
                await queries.run_notify_ready(self.pool, "reaped")
            if len(rows) < self.batch:
                return counts

    async def _tick(self) -> float:
        await self.run_once()
        ahead = await queries.run_seconds_until_lease_expiry(self.pool, self.clock.sql_now())
        cap = self.max_sleep.total_seconds()
        # Wake just after the earliest expiry; a renewed lease only means a harmless early look.
        return cap if ahead is None else max(0.01, min(cap, ahead + 0.01))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await run_forever("reaper", self._tick, self.wakeup, self.metrics)
