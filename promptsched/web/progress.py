"""Live progress for the API's event streams: one hub per process receives every progress
event (NOTIFY on ``promptsched_progress``, through the process's one listener connection) and
fans each out to the streams watching its run. Nothing is stored: a client that is not
connected misses events, and reads the durable transcript instead."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import structlog

log = structlog.get_logger("progress")

# A marker queued for every stream when the listener reconnected: events may have been lost.
GAP: dict[str, Any] = {"kind": "gap"}


class Subscription:
    """The events of one run for one stream; the oldest are dropped if the stream falls
    behind by more than ``buffer`` events (progress is ephemeral)."""

    def __init__(self, run_id: int, buffer: int) -> None:
        self.run_id = run_id
        self._items: deque[dict[str, Any]] = deque(maxlen=buffer)
        self._ready = anyio.Event()

    def put(self, item: dict[str, Any]) -> None:
        self._items.append(item)
        self._ready.set()

    async def next(self, within: float) -> list[dict[str, Any]]:
        """The events queued now, waiting up to ``within`` seconds for one."""
        if not self._items:
            with anyio.move_on_after(max(0.0, within)):
                await self._ready.wait()
        items = list(self._items)
        self._items.clear()
        self._ready = anyio.Event()
        return items


class ProgressHub:
    """``on_notify`` is the listener's handler; ``subscribe`` is used by each stream.

    ``keepalive``: seconds between comments that keep idle proxies from closing a stream;
    ``poll``: seconds between checks of the run's status (a stream ends when the run is
    final); ``max_stream``: seconds after which a stream ends and the client reconnects.
    """

    def __init__(
        self,
        *,
        keepalive: float = 15.0,
        poll: float = 1.0,
        max_stream: float = 600.0,
        buffer: int = 256,
    ) -> None:
        self.keepalive = keepalive
        self.poll = poll
        self.max_stream = max_stream
        self.buffer = buffer
        self._streams: dict[int, set[Subscription]] = {}

    def on_notify(self, payload: str | None) -> None:
        if not self._streams:
            return  # nobody watches: not even worth parsing
        if payload is None:
            for streams in self._streams.values():
                for stream in streams:
                    stream.put(GAP)
            return
        try:
            event = json.loads(payload)
            run_id = event["run_id"]
        except (ValueError, TypeError, KeyError):
            log.warning("progress.bad_event", payload=payload[:200])
            return
        for stream in self._streams.get(run_id, ()):
            stream.put(event)

    @contextmanager
    def subscribe(self, run_id: int) -> Iterator[Subscription]:
        stream = Subscription(run_id, self.buffer)
        self._streams.setdefault(run_id, set()).add(stream)
        try:
            yield stream
        finally:
            streams = self._streams.get(run_id, set())
            streams.discard(stream)
            if not streams:
                self._streams.pop(run_id, None)

    def watching(self) -> int:
        return sum(len(streams) for streams in self._streams.values())
