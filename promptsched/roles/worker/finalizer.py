"""Group commit for attempt finalization: attempts hand their final write to ``submit`` and are
done; one task writes everything that queued up meanwhile as one guarded statement
(run_finish_many), then reports each write's fate to the callback submitted with it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.metrics import Metrics
from promptsched.store import queries

log = structlog.get_logger("finalizer")

# True: the write landed. False: the attempt was stale (fenced) and changed nothing. An
# exception: the database failed, so whether the write landed is unknown.
Outcome = bool | Exception
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
        outcome: set[int] | Exception
        # Shielded and bounded: a shutdown must not cut a final write in half, and a hung
        # database must not hold the worker forever (the leases expire; the reaper decides).
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self.write_timeout
            started = time.perf_counter()
            try:
                outcome = await queries.run_finish_many(
                    self.pool, self.clock.sql_now(), [item for item, _ in batch], self.worker_id
                )
                if self._metrics is not None:
                    self._metrics.final_write_seconds.observe(time.perf_counter() - started)
            except Exception as exc:  # asyncpg raises more than PostgresError when a
                # connection dies: report it to every attempt of the batch, never crash
                outcome = exc
        if scope.cancelled_caught:
            outcome = TimeoutError(f"finalize batch took over {self.write_timeout:g}s")
        for item, done in batch:
            try:
                done(item.run_id in outcome if isinstance(outcome, set) else outcome)
            except Exception:  # a bug in one report must not stop the others' writes
                log.exception("finalizer.report_failed", run_id=item.run_id)
