"""The service's event loop (``promptsched run`` only; the CLI's short commands use the default
loop), chosen by ``PROMPTSCHED_EVENT_LOOP``:

- ``uvloop`` (``auto``, the default, where it is installed): asyncio's loop built on libuv, the
  loop uvicorn and asyncpg's authors run. Much of the service's own work per run is the event
  loop's (sockets, timers, task steps): on it the service spent 6-8 % less CPU per run (W9 at
  5,000 slow calls in flight, the W2 rush) and started its first 5,000 calls about 15 %
  sooner (docs/performance.md, "The event loop"). libuv takes on every ready socket in one
  turn; at its speed the turns stayed as short as the bounded loop's (the loop-lag probe's
  p99 at most 100 ms at 5,000 in flight).
- ``asyncio``: asyncio's own loop, with a bound on how many ready sockets one turn takes on.
  asyncio asks the kernel for every ready socket at once, and runs a callback for each before
  it looks at its timers again; the tasks those callbacks wake run in the next turn, all of
  them. With thousands of slow calls in flight their answers come back in waves (calls started
  together end together), and one turn took on a thousand answers: a hundred milliseconds and
  more in which no timer fired, no heartbeat looked and no API request was answered (the
  loop-lag probe's p99 at 250-500 ms, W9 at 5,000 in flight). With at most ``READY_PER_TURN``
  sockets a turn, the rest wait for the next turn, which comes right away: epoll is
  level-triggered and hands the sockets it held back first the next time, so none waits long,
  and timers and other tasks get their turn in between.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import select
import selectors
from collections.abc import Callable

READY_PER_TURN = 64

LOOPS = ("auto", "uvloop", "asyncio")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolved(kind: str) -> str:
    """The loop ``kind`` (one of ``LOOPS``) runs on: ``auto`` is uvloop where it is installed."""
    if kind == "auto":
        return "uvloop" if uvloop_installed() else "asyncio"
    return kind


def running() -> str:
    """Which loop runs this code: ``uvloop`` or ``asyncio``."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"


def factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop factory of ``kind`` (one of ``LOOPS``, checked by the config)."""
    if resolved(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return new_event_loop


if hasattr(selectors, "EpollSelector"):

    class BoundedEpollSelector(selectors.EpollSelector):
        """``EpollSelector.select`` (CPython 3.11-3.13), asking epoll for at most
        ``READY_PER_TURN`` ready sockets. It uses the stdlib class's own attributes (its epoll
        object and its key table), which typeshed does not declare."""

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None:
                timeout = -1
            elif timeout <= 0:
                timeout = 0
            else:  # epoll's resolution is a millisecond: wait at least the timeout
                timeout = math.ceil(timeout * 1e3) * 1e-3
            max_events = max(1, min(len(self._fd_to_key), READY_PER_TURN))  # type: ignore[attr-defined]
            ready: list[tuple[selectors.SelectorKey, int]] = []
            try:
                fd_events = self._selector.poll(timeout, max_events)  # type: ignore[attr-defined]
            except InterruptedError:
                return ready
            for fd, event in fd_events:
                events = 0
                if event & ~select.EPOLLIN:
                    events |= selectors.EVENT_WRITE
                if event & ~select.EPOLLOUT:
                    events |= selectors.EVENT_READ
                key = self._key_from_fd(fd)  # type: ignore[attr-defined]
                if key:
                    ready.append((key, events & key.events))
            return ready


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio loop whose turns take on at most ``READY_PER_TURN`` ready sockets (epoll);
    the default loop where there is no epoll."""
    if hasattr(selectors, "EpollSelector"):
        return asyncio.SelectorEventLoop(BoundedEpollSelector())
    return asyncio.new_event_loop()
