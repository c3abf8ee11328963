"""The loop shared by every role: run one tick, then sleep until woken or a deadline passes.

Database errors never kill a role: it logs, counts, and retries with capped backoff, so an
outage does not turn into a crash loop or a busy loop.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import anyio
import structlog

from promptsched.metrics import Metrics
from promptsched.store import pool as pools

_TRANSIENT = (OSError, anyio.BrokenResourceError, TimeoutError)


class Rush:
    """Whether this process's scheduler is writing a rush: a batch of due schedules came back
    full, so more are due now. Its worker pool then runs one attempt at a time until the rush
    is written (the first runs still start at once), so on cores the two share, the rush's
    rows go first and the drain follows (docs/performance.md). Other replicas' pools are not
    held back."""

    SLOTS = 1  # what a pool may fill while its scheduler writes a rush

    def __init__(self) -> None:
        self.active = False
        self.rushes = 0  # rushes begun, for tests and the log
        self._listeners: list[Callable[[], None]] = []

    def on_end(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def begin(self) -> None:
        if not self.active:
            self.active = True
            self.rushes += 1

    def end(self) -> None:
        if self.active:
            self.active = False
            for listener in self._listeners:
                listener()

    def slots(self, slots: int) -> int:
        """The slots a pool of ``slots`` may fill now."""
        return min(slots, self.SLOTS) if self.active else slots


class Wakeup:
    """A level-triggered wake-up flag: ``set`` from anywhere, ``wait`` with a timeout."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, seconds: float) -> bool:
        """True when woken, False when ``seconds`` passed. Clears the flag."""
        woken = False
        if seconds > 0:
            with anyio.move_on_after(seconds):
                await self._event.wait()
        woken = self._event.is_set()
        if woken:
            self._event = anyio.Event()
        return woken


async def run_forever(
    name: str,
    tick: Callable[[], Awaitable[float]],
    wakeup: Wakeup,
    metrics: Metrics,
    *,
    stopping: Callable[[], bool] = lambda: False,
    max_backoff: float = 10.0,
    error_event: str = "role.error",
) -> None:
    """Call ``tick`` (which returns how long to sleep) until ``stopping()``.

    ``error_event`` names the warning a failed tick logs (a role whose failures have their own
    name in the log keeps it)."""
    log = structlog.get_logger(name)
    failures = 0
    while not stopping():
        try:
            # a tick again at once if a schema change made a prepared statement stale
            delay = await pools.retry_stale(tick)
            if failures:
                log.info("role.recovered", role=name, after_failures=failures)
            failures = 0
        except Exception as exc:  # a role survives anything a tick raises, and says so
            failures += 1
            metrics.role_errors.labels(name).inc()
            delay = min(max_backoff, 0.1 * 2 ** min(failures, 10))
            log.warning(
                error_event,
                role=name,
                error=repr(exc),
                retry_in=round(delay, 3),
                failures=failures,
            )
        if not math.isfinite(delay) or delay < 0:
            delay = 0
        await wakeup.wait(delay)
