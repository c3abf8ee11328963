"""Per-provider backpressure shared by every worker slot of one process: a concurrency cap and
a token-bucket request rate.

The dispatcher asks ``available()`` before claiming runs from the database and takes one
``Permit`` per claimed run, so a rush waits as ``pending`` rows (no lease held), not as
claimed runs queued in memory. A ``fleet`` limiter's limits also hold for every replica
together: the claim checks them in Postgres (``roles/worker/pool.py``, docs/providers.md), and
this process's own permits never exceed them either.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import TracebackType

import anyio

# Float slack so 10 x 0.1 s at 10/s counts as one whole token, not 0.999...
_EPSILON = 1e-9


class Permit:
    """The right to run one attempt. ``release()`` is idempotent; also a context manager."""

    __slots__ = ("_limiter", "_released")

    def __init__(self, limiter: Limiter) -> None:
        self._limiter = limiter
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter._release()

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Limiter:
    """At most ``max_concurrency`` permits held at once, and at most ``rate_per_second`` taken
    per second on average (bursts up to ``burst``, default one second's worth, at least 1).

    Not thread-safe: one instance per provider per event loop. ``clock`` is a monotonic
    seconds counter, injectable so tests move time instead of sleeping.
    """

    def __init__(
        self,
        max_concurrency: int,
        rate_per_second: float | None = None,
        *,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        fleet: bool = False,
        tokens_per_minute: int | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if rate_per_second is not None and not rate_per_second > 0:
            raise ValueError("rate_per_second must be positive (or None for no rate limit)")
        if burst is not None and burst < 1:
            raise ValueError("burst must be at least 1")
        self._max = max_concurrency
        self._rate = rate_per_second
        self._capacity = float(burst or max(1, int(rate_per_second or 1)))
        self._clock = clock
        self._tokens = self._capacity
        self._updated = clock()
        self._in_use = 0
        self._changed: anyio.Event | None = None
        self.fleet = fleet  # the limits hold for the whole fleet, checked at claim time
        # LLM tokens a minute for the whole fleet: checked at claim time only (a run's tokens
        # are known once it ran, so no process can hold them back on its own).
        self.tokens_per_minute = tokens_per_minute

    @property
    def max_concurrency(self) -> int:
        return self._max

    @property
    def rate_per_second(self) -> float | None:
        return self._rate

    @property
    def burst(self) -> float:
        """The most rate tokens held at once (one second's worth by default)."""
        return self._capacity

    @property
    def in_use(self) -> int:
        """Permits currently held."""
        return self._in_use

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._updated)  # an injected clock may go backwards
        self._updated = now
        if self._rate is not None:
            self._tokens = min(self._capacity, self._tokens + elapsed * self._rate)

    def available(self) -> int:
        """Permits that could be taken right now: min(free concurrency, whole rate tokens)."""
        free = self._max - self._in_use
        if free <= 0 or self._rate is None:
            return max(free, 0)
        self._refill()
        return min(free, int(self._tokens + _EPSILON))

    def try_acquire(self) -> Permit | None:
        """Take a permit if one is available now; never blocks."""
        if self.available() < 1:
            return None
        self._in_use += 1
        if self._rate is not None:
            self._tokens = max(0.0, self._tokens - 1.0)
        return Permit(self)

    def seconds_until_available(self) -> float:
        """0 if a permit is available now; the wait for the next rate token if only the rate
        blocks; ``math.inf`` while every permit is held (only a release can help, and
        ``wait_available`` wakes on it)."""
        if self._in_use >= self._max:
            return math.inf
        if self._rate is None:
            return 0.0
        self._refill()
        missing = 1.0 - self._tokens
        return 0.0 if missing <= _EPSILON else missing / self._rate

    async def wait_available(self, timeout: float) -> None:  # noqa: ASYNC109 - a wake-up bound, not a deadline
        """Return when a permit may be free (a release, or the next rate token) or after
        ``timeout`` seconds, whichever is first. The caller re-checks with ``try_acquire``:
        another slot may have taken the permit meanwhile."""
        delay = min(timeout, self.seconds_until_available())
        if delay <= 0:
            return
        if self._changed is None:
            self._changed = anyio.Event()
        with anyio.move_on_after(delay):
            await self._changed.wait()

    async def acquire(self) -> Permit:
        """Wait for a permit (for callers that hold nothing durable while waiting)."""
        while True:
            permit = self.try_acquire()
            if permit is not None:
                return permit
            await self.wait_available(timeout=60.0)

    def _release(self) -> None:
        self._in_use -= 1
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def __repr__(self) -> str:
        return (
            f"Limiter(in_use={self._in_use}, max_concurrency={self._max}, "
            f"rate_per_second={self._rate})"
        )
