"""API requests per token per second (PROMPTSCHED_API_RATE, PROMPTSCHED_API_BURST): a token
bucket per token in this process; a request over it is answered 429 with ``Retry-After``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

# Buckets of tokens that have not been seen for this long are full again and are forgotten,
# so the map stays as large as the tokens in use, not every token ever seen.
_FORGET_AFTER = 600.0
_SWEEP_EVERY = 1024


@dataclass(slots=True)
class _Bucket:
    level: float
    at: float


class TokenRates:
    """``rate`` requests a second per token, ``burst`` at once; a ``rate`` of 0 is no limit.
    ``now`` is a monotonic clock in seconds (tests move their own)."""

    def __init__(
        self, rate: float, burst: int, *, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = float(max(1, burst))
        self._now = now
        self._buckets: dict[int, _Bucket] = {}
        self._seen = 0

    def take(self, token_id: int) -> float:
        """Take one request of ``token_id``'s bucket: 0.0 when it had one, else the seconds
        until it has (nothing is taken then)."""
        if self.rate <= 0:
            return 0.0
        now = self._now()
        self._seen += 1
        if self._seen % _SWEEP_EVERY == 0:
            self._sweep(now)
        bucket = self._buckets.get(token_id)
        if bucket is None:
            bucket = self._buckets[token_id] = _Bucket(self.burst, now)
        else:
            bucket.level = min(self.burst, bucket.level + (now - bucket.at) * self.rate)
            bucket.at = now
        if bucket.level >= 1.0:
            bucket.level -= 1.0
            return 0.0
        return (1.0 - bucket.level) / self.rate

    def retry_after(self, wait: float) -> str:
        """``Retry-After`` in whole seconds, never 0 (a client told 0 asks again at once)."""
        return str(max(1, math.ceil(wait)))

    def _sweep(self, now: float) -> None:
        idle = [key for key, b in self._buckets.items() if now - b.at > _FORGET_AFTER]
        for key in idle:
            del self._buckets[key]
