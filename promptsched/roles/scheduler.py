"""The scheduler owns time: it turns due slots into run rows and advances each cursor in the
same transaction, so a crash between the two is impossible.

A batch is two statements in one transaction. ``schedule_take_due`` locks up to ``batch`` due
schedules and returns them grouped by what their plan depends on (expression, zone, cursor,
misfire and overlap settings, unfinished runs), so the 9 o'clock rush of ten thousand
schedules sharing an expression computes its fire times once. ``schedule_tick`` then advances
every cursor, applies overlap cancel_other, inserts every run row and sends the NOTIFY, in one
round trip. The write between the two is planned group by group in ``tick_plan``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup, TaskStatus

from promptsched import logs, offload
from promptsched.clock import Clock
from promptsched.config import SchedulerSettings
from promptsched.domain import RunStatus
from promptsched.errors import ValidationError
from promptsched.metrics import Metrics
from promptsched.roles.loop import Rush, Wakeup, run_forever
from promptsched.roles.tick_plan import BatchPlan
from promptsched.schedule import policies
from promptsched.schedule.spec import Spec
from promptsched.store import queries

log = structlog.get_logger("scheduler")
_DEFAULTS = SchedulerSettings()

# Run rows a rush writes before the scheduler checks what the statistics of `runs` know
# (run_analyze_outgrown, migration 0018). A plan Postgres made for a table of a thousand rows
# already uses its indexes (measured: plans made at 1,000 and 2,000 rows kept a claim at 1 ms
# when the table grew to 100,000; made at 500 rows, 15 ms), so one check a rush suffices.
ANALYZE_AFTER = 5_000


@dataclass(slots=True)
class TickCounts:
    schedules: int = 0
    enqueued: int = 0
    skipped: int = 0
    duplicates: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    deferred: int = 0  # pending, but for a later minute: the owner's runs-per-minute quota


def _pause_end(row: asyncpg.Record) -> policies.PauseEnd:
    """The end of one schedule's pause; one whose fire times cannot be computed resumes as it
    was (the tick pauses it again, saying why)."""
    timing = Spec(row["kind"], row["expression"], row["timezone"], row["dst_gap"],
                  row["dst_fold"])  # fmt: skip
    try:
        return policies.plan_pause_end(timing, row["next_fire_at"], row["paused_until"],
                                       row["misfire_cap"])  # fmt: skip
    except ValidationError:
        return policies.PauseEnd((), row["next_fire_at"])


class Scheduler:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        settings: SchedulerSettings = _DEFAULTS,
        *,
        rush: Rush | None = None,
    ) -> None:
        self.pool = pool
        self.rush = rush if rush is not None else Rush()
        self.clock = clock
        self.metrics = metrics
        self.batch = settings.batch
        self.rush_batch = max(settings.batch, settings.rush_batch)
        self.max_sleep = settings.max_sleep
        self.pipeline = max(1, settings.pipeline)
        self.runs_per_minute = settings.owner_runs_per_minute
        self.wakeup = Wakeup()
        # Due schedules locked by this process's batches in flight: what a pipelined batch
        # finds locked by its siblings is not contention with another replica.
        self._held = 0

    def notify(self, _payload: str | None = None) -> None:
        """A schedule was created or changed: recompute the next wake-up now."""
        self.wakeup.set()

    async def run_once(self) -> TickCounts:
        """Enqueue every due slot, in batches, until none is due.

        A full batch means more may be due: the next one starts on another connection as soon
        as this one holds its schedules' locks, so in a rush up to ``pipeline`` batches write at
        once. SKIP LOCKED keeps them apart, as it keeps replicas apart. A quiet tick runs one
        batch and nothing more. The first batch takes ``batch`` schedules, so a rush's first
        runs are written (and start) soon; the batches after a full one take ``rush_batch``,
        fewer and larger transactions for the rest of it (docs/performance.md).
        """
        total = TickCounts()
        slots = anyio.Semaphore(self.pipeline)
        checked = False  # whether this rush has asked if it outgrew the statistics of `runs`

        async def batch(tg: TaskGroup, size: int) -> None:
            nonlocal checked
            async with slots:
                counts = await self._tick_batch(
                    size, lambda: tg.start_soon(batch, tg, self.rush_batch)
                )
            total.schedules += counts.schedules
            total.enqueued += counts.enqueued
            total.skipped += counts.skipped
            total.duplicates += counts.duplicates
            total.deferred += counts.deferred
            total.dropped.update(counts.dropped)
            written = total.enqueued + total.skipped
            if not checked and written >= ANALYZE_AFTER:
                checked = True
                tg.start_soon(self._analyze_if_outgrown, written)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(batch, tg, self.batch)
        except BaseExceptionGroup as group:
            # Each batch is its own transaction: one that failed rolled back alone and its
            # schedules stay due. Callers see the error itself, not a task-group wrapper.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            self.rush.end()  # written (or failed): the workers use every slot again
        return total

    async def _tick_batch(self, size: int, more: Callable[[], object]) -> TickCounts:
        now = self.clock.sql_now()
        batch = BatchPlan()
        taken = 0
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                due = await queries.schedule_take_due(conn, now, size, self._held)
                taken = due.taken
                self._held += taken
                self._count_take(due)
                for group in due:
                    try:
                        await batch.plan_off_loop(group)
                        batch.add_group(group)
                    except ValidationError as exc:  # one unreadable schedule must not stop
                        await self._pause_unplannable(conn, group.ids, exc)  # the rest
                if taken >= size:
                    self.rush.begin()  # more is due now: this process's workers hold back
                    more()
                if not batch.schedules:
                    return TickCounts()
                result = await queries.schedule_tick(
                    conn, now, batch.write(), all_rows=logs.enabled("debug"),
                    runs_per_minute=self.runs_per_minute,
                )  # fmt: skip
        finally:
            self._held -= taken  # committed or rolled back: the locks are gone
        return self._count(batch, result)

    async def _analyze_if_outgrown(self, written: int) -> None:
        """Cached plans made while `runs` was nearly empty must not serve a table this rush
        filled: analyzed, every session plans it again (migration 0018). Beside the batches,
        never in their way; a failure changes nothing but the plans' freshness."""
        try:
            known = await queries.run_analyze_outgrown(self.pool, written)
        except Exception as exc:  # asyncpg raises more than PostgresError on a dying connection
            log.warning("scheduler.analyze_failed", error=repr(exc))
            return
        if known is not None:
            log.info("scheduler.runs_analyzed", written=written, known_rows=max(0, int(known)))

    def _count_take(self, due: queries.DueBatch) -> None:
        """Contended when due schedules it could have taken were locked by another scheduler
        (SKIP LOCKED passed them over), whatever it took besides."""
        result = "contended" if due.contended else "taken" if due else "empty"
        self.metrics.scheduler_batches.labels(result).inc()

    async def _pause_unplannable(self, conn: Any, ids: list[int], exc: ValidationError) -> None:
        """Schedules whose fire times cannot be computed (a zone or expression this version no
        longer reads) would fail their batch on every tick, and every schedule due with them
        would wait: pause them, saying why, in the batch's transaction. Any other error is a
        bug of ours, not of the schedules: it fails the batch, which the next tick retries."""
        error = f"{type(exc).__name__}: {exc}"[:300]
        await queries.schedule_pause_unplannable(
            conn, ids, f"paused: its fire times could not be computed ({error})"
        )
        self.metrics.role_errors.labels("scheduler").inc()
        log.error("scheduler.schedules_paused", schedule_ids=ids[:20], count=len(ids), error=error)

    def _count(self, batch: BatchPlan, result: asyncpg.Record) -> TickCounts:
        counts = TickCounts(
            schedules=batch.schedules,
            enqueued=result["enqueued"],
            skipped=result["skipped"],
            duplicates=batch.planned - result["enqueued"] - result["skipped"],
            dropped=batch.dropped,
            deferred=result["deferred"],
        )
        if result["overlap"]:
            counts.dropped["overlap"] += result["overlap"]
        if result["cancelled"]:
            counts.dropped["cancelled_by_overlap"] += result["cancelled"]
        observe = self.metrics.tick_lag.observe
        for lag in result["lags"]:
            observe(lag if lag > 0.0 else 0.0)
        # One line per run created, bound to its ids: a skipped tick at info (a dropped slot
        # is news), an enqueued one at debug (a 9 o'clock rush writes thousands, so the
        # statement returns those only when debug is on).
        for run_id, schedule_id, slot, status, skip_reason, missed in result["logged"]:
            pending = status == RunStatus.PENDING
            (log.debug if pending else log.info)(
                "run.enqueued" if pending else "run.skipped",
                run_id=run_id,
                schedule_id=schedule_id,
                slot=slot.isoformat(),
                skip_reason=skip_reason,
                missed_slots=missed,
            )
        self.metrics.ticks.labels("enqueued").inc(counts.enqueued)
        self.metrics.ticks.labels("skipped").inc(counts.skipped)
        self.metrics.ticks.labels("duplicate").inc(counts.duplicates)
        for reason, number in counts.dropped.items():
            self.metrics.dropped_ticks.labels(reason).inc(number)
        if counts.deferred:
            self.metrics.runs_deferred.inc(counts.deferred)
            log.info("scheduler.runs_deferred", runs=counts.deferred,
                     quota=self.runs_per_minute)  # fmt: skip
        if counts.enqueued or counts.skipped:
            log.info(
                "scheduler.ticked",
                schedules=counts.schedules,
                enqueued=counts.enqueued,
                skipped=counts.skipped,
                duplicates=counts.duplicates,
            )
        return counts

    async def seconds_until_due(self) -> float:
        seconds = await queries.schedule_seconds_until_due(self.pool, self.clock.sql_now())
        cap = self.max_sleep.total_seconds()
        return cap if seconds is None else max(0.0, min(cap, seconds))

    async def resume_due(self) -> int:
        """End the pauses whose end came ("pause until"), in one transaction: the slots inside
        a pause are skipped (reason ``paused``) and the schedule fires from the first slot
        after it (``policies.plan_pause_end``). Returns how many schedules resumed."""
        now = self.clock.sql_now()
        async with self.pool.acquire() as conn, conn.transaction():
            due = await queries.schedule_take_pause_ended(conn, now, self.batch)
            if not due:
                return 0
            ends = queries.PauseEnds()
            for row in due:
                plan = await offload.run(
                    functools.partial(_pause_end, row), field=None, lane="scheduler"
                )
                ends.schedule_ids.append(row["id"])
                ends.cursors.append(plan.next_fire_at)
                for run in plan.runs:
                    ends.run_schedule_ids.append(row["id"])
                    ends.slots.append(run.slot)
                    ends.missed.append(run.missed)
            resumed = await queries.schedule_end_pauses(conn, now, ends)
        for schedule_id, skipped in resumed:
            log.info("schedule.auto_resumed", schedule_id=schedule_id, skipped_slots=skipped)
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
