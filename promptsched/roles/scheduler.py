"""The scheduler owns time: it turns due slots into run rows and advances each cursor in the
same transaction, so a crash between the two is impossible."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.metrics import Metrics
from promptsched.roles.loop import Wakeup, run_forever
from promptsched.schedule import jitter, overlap, policies
from promptsched.schedule.spec import Spec
from promptsched.store import queries
from promptsched.store.pool import Conn

log = structlog.get_logger("scheduler")


@dataclass(slots=True)
class TickCounts:
    schedules: int = 0
    enqueued: int = 0
    skipped: int = 0
    duplicates: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


@lru_cache(maxsize=65_536)
def _plan(
    spec: Spec, due_from: datetime, now: datetime, misfire: policies.Misfire
) -> policies.TickPlan:
    # Schedules sharing an expression, zone and cursor (the 9 o'clock rush) share one
    # computation.
    return policies.plan_tick(spec, due_from, now, misfire)


@lru_cache(maxsize=4096)
def _spec_of(kind: str, expression: str, timezone: str, gap: str, fold: str) -> Spec:
    return Spec(
        kind=kind,  # type: ignore[arg-type]  # the schema's CHECK constraints hold these
        expression=expression,
        timezone=timezone,
        dst_gap=gap,  # type: ignore[arg-type]
        dst_fold=fold,  # type: ignore[arg-type]
    )


@lru_cache(maxsize=1024)
def _misfire_of(
    policy: str, cap: int, window: timedelta | None, grace: timedelta
) -> policies.Misfire:
    return policies.Misfire(
        policy=policy,  # type: ignore[arg-type]  # checked by the schema's CHECK constraint
        cap=cap,
        catchup_window=window,
        grace=grace,
    )


def _spec(row: asyncpg.Record) -> Spec:
    # Cached: the rows of a rush share a handful of specs, and the plan cache keys on them.
    return _spec_of(
        row["kind"], row["expression"], row["timezone"], row["dst_gap"], row["dst_fold"]
    )


def _misfire(row: asyncpg.Record) -> policies.Misfire:
    return _misfire_of(
        row["misfire_policy"], row["misfire_cap"], row["catchup_window"], row["misfire_grace"]
    )


class Scheduler:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        *,
        batch: int = 500,
        max_sleep: timedelta = timedelta(seconds=5),
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.batch = batch
        self.max_sleep = max_sleep
        self.wakeup = Wakeup()

    def notify(self, _payload: str | None = None) -> None:
        """A schedule was created or changed: recompute the next wake-up now."""
        self.wakeup.set()

    async def run_once(self) -> TickCounts:
        """Enqueue every due slot, in batches, until none is due."""
        total = TickCounts()
        while True:
            counts = await self._tick_batch()
            total.schedules += counts.schedules
            total.enqueued += counts.enqueued
            total.skipped += counts.skipped
            total.duplicates += counts.duplicates
            total.dropped.update(counts.dropped)
            if counts.schedules < self.batch:
                return total

    async def _tick_batch(self) -> TickCounts:
        counts = TickCounts()
        now = self.clock.sql_now()
        async with self.pool.acquire() as conn, conn.transaction():
            due = await queries.schedule_take_due(conn, now, self.batch)
            if not due:
                return counts
            db_now: datetime = due[0]["db_now"]
            counts.schedules = len(due)
            plans = {
                row["id"]: _plan(_spec(row), row["next_fire_at"], db_now, _misfire(row))
                for row in due
            }
            rows = await self._apply_overlap(conn, now, due, plans, counts)
            inserted = await self._insert(conn, now, rows)
            await queries.schedule_advance_many(
                conn, [row["id"] for row in due], [plans[row["id"]].next_fire_at for row in due]
            )
            if any(r["status"] == "pending" for r in inserted):
                await queries.run_notify_ready(conn, "tick")
        self._count(counts, inserted, len(rows), plans)
        return counts

    async def _apply_overlap(
        self,
        conn: Conn,
        now: datetime | None,
        due: list[asyncpg.Record],
        plans: dict[int, policies.TickPlan],
        counts: TickCounts,
    ) -> list[tuple[int, policies.PlannedRun, datetime]]:
        policy_of = {row["id"]: row["overlap_policy"] for row in due}
        jitter_of = {row["id"]: row["jitter"] for row in due}
        checked = [
            sid
            for sid, plan in plans.items()
            if policy_of[sid] != "allow" and any(r.status == "pending" for r in plan.runs)
        ]
        unfinished = (
            {
                r["schedule_id"]: (r["pending"], r["running"])
                for r in await queries.run_unfinished_counts(conn, checked)
            }
            if checked
            else {}
        )
        cancel: list[int] = []
        rows: list[tuple[int, policies.PlannedRun, datetime]] = []
        for sid, plan in plans.items():
            pending, running = unfinished.get(sid, (0, 0))
            decision = overlap.apply(
                policy_of[sid], pending=pending, running=running, planned=plan.runs
            )
            if decision.cancel_unfinished:
                cancel.append(sid)
            for run in decision.runs:
                delay = jitter.offset(sid, run.slot, jitter_of[sid]) if jitter_of[sid] else None
                rows.append((sid, run, run.slot + delay if delay else run.slot))
        if cancel:
            result = await queries.run_cancel_unfinished(conn, now, cancel)
            counts.dropped["cancelled_by_overlap"] += result["cancelled"]
        return rows

    async def _insert(
        self,
        conn: Conn,
        now: datetime | None,
        rows: list[tuple[int, policies.PlannedRun, datetime]],
    ) -> list[asyncpg.Record]:
        if not rows:
            return []
        return await queries.run_insert_ticks(
            conn,
            now,
            [sid for sid, _, _ in rows],
            [run.slot for _, run, _ in rows],
            [run.status for _, run, _ in rows],
            [run.skip_reason for _, run, _ in rows],
            [run.missed for _, run, _ in rows],
            [available for _, _, available in rows],
        )

    def _count(
        self,
        counts: TickCounts,
        inserted: list[asyncpg.Record],
        planned: int,
        plans: dict[int, policies.TickPlan],
    ) -> None:
        logger = log.bind()  # resolve the lazy proxy once, not once per row
        for row in inserted:
            # One line per run created, bound to its ids: a skipped tick at info (a dropped
            # slot is news), an enqueued one at debug (a 9 o'clock rush writes thousands).
            (logger.debug if row["status"] == "pending" else logger.info)(
                "run.enqueued" if row["status"] == "pending" else "run.skipped",
                run_id=row["id"],
                schedule_id=row["schedule_id"],
                slot=row["slot"].isoformat(),
                skip_reason=row["skip_reason"],
                missed_slots=row["missed_slots"],
            )
            if row["status"] == "pending":
                counts.enqueued += 1
                self.metrics.tick_lag.observe(
                    max(0.0, (row["created_at"] - row["slot"]).total_seconds())
                )
            else:
                counts.skipped += 1
                if row["skip_reason"] == "overlap":
                    counts.dropped["overlap"] += 1
        counts.duplicates = planned - len(inserted)
        for plan in plans.values():
            counts.dropped.update(plan.dropped)
        self.metrics.ticks.labels("enqueued").inc(counts.enqueued)
        self.metrics.ticks.labels("skipped").inc(counts.skipped)
        self.metrics.ticks.labels("duplicate").inc(counts.duplicates)
        for reason, number in counts.dropped.items():
            self.metrics.dropped_ticks.labels(reason).inc(number)
        if counts.enqueued or counts.skipped:
            log.info(
                "scheduler.ticked",
                schedules=counts.schedules,
                enqueued=counts.enqueued,
                skipped=counts.skipped,
                duplicates=counts.duplicates,
            )

    async def seconds_until_due(self) -> float:
        seconds = await queries.schedule_seconds_until_due(self.pool, self.clock.sql_now())
        cap = self.max_sleep.total_seconds()
        return cap if seconds is None else max(0.0, min(cap, seconds))

    async def resume_due(self) -> int:
        """Resume schedules whose "pause until" ran out."""
        resumed = await queries.schedule_resume_due(self.pool, self.clock.sql_now())
        for row in resumed:
            await queries.schedule_change_insert(
                self.pool, row["id"], row["owner"], "promptsched", "auto_resume", {}
            )
            log.info("schedule.auto_resumed", schedule_id=row["id"])
        return len(resumed)

    async def _tick(self) -> float:
        await self.resume_due()
        counts = await self.run_once()
        self.metrics.scheduler_alive.set_to_current_time()
        delay = await self.seconds_until_due()
        if delay == 0 and counts.schedules == 0:
            # Due, but another scheduler holds those rows: look again shortly, do not spin.
            return 0.01
        return delay

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await run_forever("scheduler", self._tick, self.wakeup, self.metrics)
