"""Group commit for attempt finalization: attempts finishing at about the same time share one
guarded statement (run_finish_many) instead of a round trip each."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import asyncpg

from promptsched.clock import Clock
from promptsched.store import queries


class _Waiter:
    __slots__ = ("done", "error", "landed")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.landed = False
        self.error: BaseException | None = None


class Finalizer:
    """``finish`` returns True when the write landed, False when the attempt was fenced.

    The first caller with nothing in flight leads: it lets the other finishers of this event
    loop turn queue up, then writes batches until the queue is empty. Every write is still
    conditioned on its own attempt_id, so batching changes no outcome.
    """

    def __init__(self, pool: asyncpg.Pool[Any], clock: Clock, *, max_batch: int = 256) -> None:
        self.pool = pool
        self.clock = clock
        self.max_batch = max_batch
        self._queue: list[tuple[queries.Finish, _Waiter]] = []
        self._leading = False

    async def finish(self, item: queries.Finish) -> bool:
        waiter = _Waiter()
        self._queue.append((item, waiter))
        if not self._leading:
            self._leading = True
            try:
                # Let the attempts finishing in this same loop turn join the batch.
                await anyio.lowlevel.checkpoint()
                await self._drain()
            finally:
                self._leading = False
        await waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error
        return waiter.landed

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                landed = await queries.run_finish_many(
                    self.pool, self.clock.sql_now(), [item for item, _ in batch]
                )
            except BaseException as exc:
                # The other finishers learn the write did not happen (their callers log it;
                # the lease then expires and the reaper decides), never a foreign cancellation.
                failure = RuntimeError(f"finalize batch failed: {exc!r}")
                for _, waiter in [*batch, *self._queue]:
                    waiter.error = failure
                    waiter.done.set()
                self._queue = []
                raise
            for item, waiter in batch:
                waiter.landed = item.run_id in landed
                waiter.done.set()
