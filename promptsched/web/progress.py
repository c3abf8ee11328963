"""Live progress for the API's event streams: one hub per process receives every progress
event (NOTIFY on ``promptsched_progress``, through the process's one listener connection) and
fans each out to the streams watching its run. Nothing is stored: a client that is not
connected misses events, and reads the durable transcript instead."""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import asyncpg
import structlog
from aiohttp import web

from promptsched import errors
from promptsched.clock import Clock
from promptsched.domain import RunStatus
from promptsched.store import queries
from promptsched.web import auth

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


# A stream ends once its run is final (or was deleted with its schedule).
ENDED = frozenset({*(s.value for s in RunStatus if s.finished), "deleted"})
RETRY_MS = 2000  # how long an EventSource waits before reconnecting
REVOKED = "the token was revoked or the session logged out"


def frame(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def stream_run(
    request: web.Request,
    *,
    pool: asyncpg.Pool[Any],
    hub: ProgressHub,
    run_id: int,
    who: auth.Principal,
    clock: Clock,
) -> web.StreamResponse:
    """A run's live progress as Server-Sent Events, for the API and the console alike:
    ``event: progress`` per step, comments to keep the stream alive, ``event: gap`` when events
    may have been lost, ``event: done`` once the run is final, and ``event: revoked`` (then the
    end) once ``who``'s token is revoked or its console session logged out, whichever replica
    did it. NotFound when the run is not there for ``who``."""
    check = Check(pool, clock, run_id, who)
    # Subscribe before reading the status: an event in between is queued, not lost.
    with hub.subscribe(run_id) as subscription:
        status = await check.status()
        if status is None:
            raise errors.NotFound("run", run_id)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # nginx: pass events through at once
            }
        )
        await response.prepare(request)
        try:
            await response.write(f"retry: {RETRY_MS}\n: watching run {run_id}\n\n".encode())
            await _pump(response, subscription, status, check=check, hub=hub)
        except ConnectionError:  # the client went away
            pass
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # The response has started: no error body any more. End it; the client reconnects.
            log.warning("progress.stream_failed", run_id=run_id, error=repr(exc))
            with contextlib.suppress(ConnectionError):
                await response.write(b": the stream failed; reconnect\n\n")
        return response


class Check:
    """What a stream reads each poll, in one statement: its run's status, and whether the
    credentials it was opened with still live (a revoked token, an ended session)."""

    def __init__(
        self, pool: asyncpg.Pool[Any], clock: Clock, run_id: int, who: auth.Principal
    ) -> None:
        self.pool, self.clock, self.run_id, self.who = pool, clock, run_id, who
        self.live = True

    async def status(self) -> str | None:
        row = await queries.run_stream_check(
            self.pool, self.run_id, self.who.scope, self.who.token_id, self.who.session_id,
            self.clock.sql_now(),
        )  # fmt: skip
        self.live = bool(row["live"])
        status: str | None = row["status"]
        return status


async def _pump(
    response: web.StreamResponse,
    subscription: Subscription,
    status: str,
    *,
    check: Check,
    hub: ProgressHub,
) -> None:
    run_id = subscription.run_id
    deadline = anyio.current_time() + hub.max_stream
    last_write = anyio.current_time()
    while status not in ENDED:
        left = deadline - anyio.current_time()
        if left <= 0:
            await response.write(b": stream time limit reached; reconnect to go on\n\n")
            return
        for event in await subscription.next(min(hub.poll, left)):
            if event is GAP:  # the listener reconnected: events may have been lost
                await response.write(frame("gap", {"run_id": run_id}))
            else:
                await response.write(frame("progress", event))
            last_write = anyio.current_time()
        if anyio.current_time() - last_write >= hub.keepalive:
            await response.write(b": keep-alive\n\n")
            last_write = anyio.current_time()
        status = await check.status() or "deleted"
        if not check.live:
            await response.write(frame("revoked", {"run_id": run_id, "reason": REVOKED}))
            return
    await response.write(frame("done", {"run_id": run_id, "status": status}))
