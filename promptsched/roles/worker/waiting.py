"""When the worker pool's dispatcher asks a provider for runs again, and how long it may sleep
until there is work: a provider whose claim took everything it had is left out of the claims
until its next pending run is available or a NOTIFY says runs were written, and the wait ends
by then, by a provider's next permit or rate token, or by a fleet-wide limit's backoff."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import asyncpg

from promptsched.clock import Clock
from promptsched.executors.limiter import Limiter
from promptsched.roles.worker.fleet import Fleet
from promptsched.store import queries


class Waiting:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        limiters: Mapping[str, Limiter],
        fleet: Fleet,
        max_sleep: timedelta,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.limiters = limiters
        self.fleet = fleet
        self.max_sleep = max_sleep
        # Providers whose last claim took all they had, and when (monotonic) their next run
        # becomes available (max_sleep ahead when none is pending). A claim of the unused
        # `echo` ran beside every claim of a busy provider, one round trip each.
        self.drained: dict[str, float] = {}
        self._blocked_backoff = 0.0

    def skipped(self, provider: str) -> bool:
        """Whether the next claim leaves ``provider`` out."""
        return self.drained.get(provider, 0.0) > time.monotonic()

    def clear(self) -> None:
        """Runs may have been written anywhere: ask every provider again."""
        self.drained.clear()

    def requeued(self, provider: str, seconds: float) -> None:
        """This process wrote a run of ``provider`` back to ``pending`` (a retry, a throttle, a
        move to a fallback), available in ``seconds``. A mark set while nothing of it was
        pending (then it lasts ``max_sleep``) must not outlast the run: the run is retried when
        it is due, not when the dispatcher's idle sleep ends. No NOTIFY says so: the process
        that wrote the run claims it."""
        until = self.drained.get(provider)
        if until is not None:
            self.drained[provider] = min(until, time.monotonic() + max(0.0, seconds))

    def claimed(self, provider: str, claim: queries.Claim, want: int) -> bool:
        """Whether ``claim`` took all ``provider`` had (fewer than wanted, none held by others):
        then ``drain`` leaves it out until its next run."""
        if len(claim) < want and claim.claimable <= len(claim):
            return True
        self.drained.pop(provider, None)
        if claim:
            self._blocked_backoff = 0.0
        return False

    async def drain(self, provider: str) -> None:
        """Leave ``provider`` out of the claims until its next pending run is available."""
        ahead = await queries.run_seconds_until_available(
            self.pool, self.clock.sql_now(), [provider]
        )
        wait = self.max_sleep.total_seconds() if ahead is None else max(0.0, ahead)
        self.drained[provider] = time.monotonic() + wait

    async def seconds_until_work(self, free_slots: int) -> float:
        """How long the dispatcher may sleep after a claim that started nothing."""
        cap = self.max_sleep.total_seconds()
        if free_slots <= 0:
            return cap  # a finishing attempt wakes us
        now = time.monotonic()
        ready = [
            p
            for p, limiter in self.limiters.items()
            if limiter.available() > 0 and self.drained.get(p, 0.0) <= now
        ]
        rate_waits = [  # a provider at its limit: until its next permit or rate token
            limiter.seconds_until_available()
            for limiter in self.limiters.values()
            if limiter.available() <= 0
        ]
        # A provider left out of the claims is asked again when its next run is available.
        cap = min([cap, *(until - now for until in self.drained.values() if until > now)])
        if not ready:
            return max(0.0, min([cap, *rate_waits]))
        if self.fleet.waits:  # a fleet-wide limit held a provider's last claim back
            cap = min(cap, *self.fleet.waits.values())
        ahead = await queries.run_seconds_until_available(self.pool, self.clock.sql_now(), ready)
        if ahead is not None and ahead <= 0:
            # Available work we could not claim: another replica holds it, or a serial run
            # waits for its predecessor. Back off (50 ms doubling to 1 s) rather than spin.
            self._blocked_backoff = min(1.0, max(0.05, self._blocked_backoff * 2))
            return min(cap, self._blocked_backoff)
        self._blocked_backoff = 0.0
        return cap if ahead is None else min(cap, ahead)
