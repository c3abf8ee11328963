"""Group commit for attempt finalization: attempts hand their final write to ``submit`` and are
done; one task writes everything that queued up meanwhile as one guarded statement
(run_finish_many), then reports each write's fate to the callback submitted with it. A batch
Postgres refuses for one row's values is written again without that row, whose run alone ends
dead with the reason (docs/reliability.md, "Isolation of failure")."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched import storable
from promptsched.clock import Clock
from promptsched.metrics import Metrics
from promptsched.roles.worker import attempt
from promptsched.store import queries

log = structlog.get_logger("finalizer")

# SQLSTATE classes of a refusal caused by a row's own values: a data exception (a NUL, a number
# out of range, JSON that jsonb cannot hold, asyncpg's "invalid input for query argument"), an
# integrity constraint violation, a program limit exceeded (a value too large). Retrying the
# rest of the batch without that row can land; any other error is the database's, not a row's.
ROW_FAULTS = ("22", "23", "54")
REASON_CHARS = 300


def refused_for_a_row(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.PostgresError) and str(exc.sqlstate or "")[:2] in ROW_FAULTS


@dataclass(frozen=True, slots=True)
class Refused:
    """Postgres refused this write alone; the run was ended by ``replacement`` instead (dead,
    with the reason), which ``landed`` or was fenced."""

    replacement: queries.Finish
    landed: bool


# True: the write landed. False: the attempt was stale (fenced) and changed nothing. Refused:
# the write was refused for its own values and its run ended dead instead. An exception: the
# database failed, so whether the write landed is unknown.
Outcome = bool | Refused | Exception
Done = Callable[[Outcome], None]


class Finalizer:
    """Every write is conditioned on its own attempt_id, so batching changes no outcome.

    While a batch is in flight the next one queues up, so the batch size follows the load:
    one row when the process is quiet, hundreds in a rush, with one round trip each. A second
    writer takes a batch only when a full one is waiting while the first writes: a wave of
    answers (thousands of slow calls started together end together) is written two batches at
    a time, and a drain of fast runs, whose queue never fills a batch, by one writer, since
    two concurrent finishes contend for the same index pages (W2: 1.28 s with one writer
    against 1.43 s with two always writing, medians of 6, docs/performance.md).
    """

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        worker_id: str,
        metrics: Metrics | None = None,
        *,
        max_batch: int = 256,
        write_timeout: float = 10.0,
        writers: int = 2,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.worker_id = worker_id
        self._metrics = metrics
        self.max_batch = max_batch
        self.write_timeout = write_timeout
        self.writers = writers
        self._queue: list[tuple[queries.Finish, Done]] = []
        self._ready = anyio.Event()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def submit(self, item: queries.Finish, done: Done) -> None:
        """Queue ``item``; ``done`` is called (from the finalizer's task) once its fate is known."""
        self._queue.append((item, done))
        self._ready.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            for index in range(self.writers):
                tg.start_soon(self._writer, index)
            task_status.started()

    async def _writer(self, index: int) -> None:
        """Write what is queued, a batch at a time: the first writer whatever is queued, the
        others only a full batch (the first is busy, or it would have taken it)."""
        enough = 1 if index == 0 else self.max_batch
        while True:
            while len(self._queue) < enough:
                ready = self._ready
                await ready.wait()
                if self._ready is ready:
                    self._ready = anyio.Event()
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            await self._write(batch)

    async def _write(self, batch: list[tuple[queries.Finish, Done]]) -> None:
        fates: dict[int, Outcome] = {}
        # Shielded and bounded: a shutdown must not cut a final write in half, and a hung
        # database must not hold the worker forever (the leases expire; the reaper decides).
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self.write_timeout
            started = time.perf_counter()
            await self._land(list(enumerate(item for item, _ in batch)), fates)
            if self._metrics is not None and not any(
                isinstance(fate, Exception) for fate in fates.values()
            ):
                self._metrics.final_write_seconds.observe(time.perf_counter() - started)
        # A write whose statement the deadline cut is unknown; one whose statement ended is not
        # (a batch written again in parts may be cut after some of them).
        late = TimeoutError(f"finalize batch took over {self.write_timeout:g}s")
        for index, (item, done) in enumerate(batch):
            try:
                done(fates.get(index, late))
            except Exception:  # a bug in one report must not stop the others' writes
                log.exception("finalizer.report_failed", run_id=item.run_id)

    async def _land(
        self, items: list[tuple[int, queries.Finish]], fates: dict[int, Outcome]
    ) -> None:
        """Write ``items`` as one statement and record each one's fate by its index. A batch
        that Postgres refuses for a row's own values is written again as two halves, down to
        the one write it refuses, which ends its run with the reason instead (``refused``):
        one answer it cannot store fails no other run, and no run is left to its lease."""
        try:
            landed = await queries.run_finish_many(
                self.pool, self.clock.sql_now(), [item for _, item in items], self.worker_id
            )
        except Exception as exc:  # asyncpg raises more than PostgresError when a connection
            # dies: report it to every attempt of the batch, never crash
            if not refused_for_a_row(exc):
                fates.update((index, exc) for index, _ in items)
            elif len(items) > 1:
                log.warning("finalizer.batch_refused", rows=len(items), error=type(exc).__name__)
                half = len(items) // 2
                await self._land(items[:half], fates)
                await self._land(items[half:], fates)
            else:
                index, item = items[0]
                fates[index] = await self._refused(item, exc)
            return
        fates.update((index, item.run_id in landed) for index, item in items)

    async def _refused(self, item: queries.Finish, exc: Exception) -> Outcome:
        """The run of the one write Postgres refused, ended ``dead`` with the reason."""
        reason = storable.clean(str(exc))
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 1] + "…"
        log.error("finalizer.write_refused", run_id=item.run_id, error=type(exc).__name__)
        replacement = attempt.refused(item, reason)
        try:
            landed = await queries.run_finish_many(
                self.pool, self.clock.sql_now(), [replacement], self.worker_id
            )
        except Exception as again:
            return again
        return Refused(replacement, item.run_id in landed)
