"""The fleet-wide limits of a provider as one process meets them: the claim they admit (one
statement under the provider's advisory lock, docs/providers.md), how long to wait while they
bind, and what each attempt reports back to the provider's shared row (the tokens it used, its
success or failure for the circuit breaker and the concurrency ramp, and the pacing its
rate-limit headers asked for)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import structlog

from promptsched.clock import Clock
from promptsched.domain import ClaimedRun
from promptsched.errors import ExecutorError
from promptsched.executors.base import ExecutionResult
from promptsched.executors.limiter import Limiter
from promptsched.metrics import Children, Metrics
from promptsched.roles.worker.attempt import Outcome
from promptsched.roles.worker.inflight import InFlight, StopReason
from promptsched.store import queries

log = structlog.get_logger("worker")

# The fleet's circuit breaker of a provider (docs/providers.md): a throttled answer (a 429, a
# 503 with Retry-After) opens it at once, for as long as the provider asked, else for
# THROTTLE_OPEN seconds doubling per throttled answer in a row; BREAKER_FAILURES other
# retryable failures in a row open it for BREAKER_BASE seconds, doubling per further failure;
# both up to BREAKER_MAX. Only attempts that started after it last opened count.
BREAKER_FAILURES = 5
BREAKER_BASE = 30.0
THROTTLE_OPEN = 5.0
BREAKER_MAX = 300.0
# The window a throttled answer without a wait of its own ends, for learning the provider's
# rate (0030_provider_learned_rate.sql): the per-minute limits answer that way.
THROTTLE_WINDOW = 60.0
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
_WRITE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


class Fleet:
    """This process's side of every limited provider's shared row."""

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        children: Children,
        limiters: Mapping[str, Limiter],
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self._child = children
        self.limiters = limiters
        self.waits: dict[str, float] = {}  # provider -> wait, while a fleet limit binds
        self._breaker: dict[str, str] = {}  # provider -> its breaker as last read at a claim
        self._failing: dict[str, bool] = {}  # provider -> failures counted at the last claim
        self._ramping: dict[str, bool] = {}  # provider -> its concurrency ramps back
        self._paced: set[str] = set()  # providers whose headers held the last claim back
        self._probes: set[int] = set()  # runs claimed as a half-open breaker's probe
        self.moved = 0  # runs moved to a fallback by claims held back since last read

    async def claim(
        self,
        provider: str,
        want: int,
        worker_id: str,
        lease: timedelta,
        returned: Sequence[InFlight] = (),
    ) -> queries.Claim:
        """Claim at most what the provider's limits leave for the whole fleet: its calls in
        flight (every replica's running runs, less this process's ``returned``: attempts whose
        call is over and whose final write is on its way) below ``max_concurrency``, whole
        tokens of its shared rate bucket, a positive LLM-token bucket, nothing while its breaker
        is open and one probe while half-open. One statement: it takes the provider's advisory
        lock, so two replicas never both fill the last free place (docs/providers.md)."""
        limiter = self.limiters[provider]
        claim = await queries.run_claim_limited(
            self.pool, self.clock.sql_now(), provider, want, worker_id, lease,
            max_concurrency=limiter.max_concurrency, rate=limiter.rate_per_second,
            burst=limiter.burst, tokens_per_minute=limiter.tokens_per_minute,
            returned=[a.run_id for a in returned],
            returned_attempts=[a.attempt_id for a in returned],
        )  # fmt: skip
        room = claim.room
        state = "open" if room.open_for > 0 else "half_open" if room.half_open else "closed"
        self._set_breaker(provider, state)
        self._failing[provider] = room.failures > 0
        self._ramping[provider] = room.ramp is not None
        allowed = limiter.max_concurrency if room.ramp is None else int(room.ramp + 1e-6)
        self._child(self.metrics.provider_allowed_concurrency, provider).set(
            min(allowed, limiter.max_concurrency)
        )
        self._child(self.metrics.provider_in_flight, provider).set(room.running + len(claim))
        if room.paced_for > 0:
            self._paced.add(provider)
        else:
            self._paced.discard(provider)
        if room.allowed <= 0:
            reason = (
                "open" if state == "open"
                else "paced" if room.paced_for > 0
                else "tokens" if room.llm_tokens is not None and room.llm_tokens <= 0
                else "concurrency" if room.running >= limiter.max_concurrency
                or state == "half_open" else "ramp" if room.ramp is not None
                and room.running >= int(room.ramp + 1e-6) else "rate"
            )  # fmt: skip
            self._child(self.metrics.throttled_claims, provider, reason).inc()
            self.waits[provider] = self._backoff(provider, limiter, room, reason)
            if reason in ("open", "paced") and len(self.limiters) > 1:
                await self._reroute(provider, want)
        else:
            self.waits.pop(provider, None)
        if state == "half_open":
            self._probes.update(row.id for row in claim)
        return claim

    async def _reroute(self, provider: str, want: int) -> None:
        """While the provider's breaker is open or its headers pace it, up to ``want`` of its
        waiting runs whose schedule names a fallback go on to the next place of their route
        that can take them now (run_reroute_held), instead of waiting for the probe; counted
        by provider pair, and every replica is woken to claim them."""
        moved = await queries.run_reroute_held(
            self.pool, self.clock.sql_now(), provider, want, list(self.limiters)
        )
        for target in moved:
            self._child(self.metrics.provider_fallbacks, provider, target).inc()
        if moved:
            self.moved += len(moved)
            await queries.run_notify_ready(self.pool, "fallback")  # every replica claims them

    def _backoff(
        self, provider: str, limiter: Limiter, room: queries.ProviderRoom, reason: str
    ) -> float:
        """How long to wait before asking a throttled provider again: until its breaker
        half-opens, until its next rate token, until its LLM-token bucket is positive again, or
        (when full) 50 ms doubling to 1 s, since another replica's finish does not wake this
        one."""
        if reason == "open":
            return max(0.05, room.open_for)
        if reason == "paced":
            return max(0.01, room.paced_for)
        if reason == "tokens" and room.llm_tokens is not None and limiter.tokens_per_minute:
            return max(0.01, -room.llm_tokens / (limiter.tokens_per_minute / 60))
        if reason == "rate" and room.rate:  # the configured or the learned rate
            return max(0.01, (1.0 - (room.rate_tokens or 0.0)) / room.rate)
        return min(1.0, max(0.05, self.waits.get(provider, 0.0) * 2))

    async def report(
        self, row: ClaimedRun, attempt: InFlight, outcome: Outcome, usage: Mapping[str, Any]
    ) -> None:
        """Tell the provider's fleet-wide row what this attempt met: the tokens it used
        (``usage``, as its provider reported it), and
        its success or failure for the breaker. Written before the attempt's final write, while
        its run still counts as running, so every claim either counts the run in flight or sees
        what it reported, never neither (a half-open breaker whose probe has finished but not
        yet reported would let a second probe through)."""
        probe = row.id in self._probes
        self._probes.discard(row.id)
        tokens_per_minute = self.limiters[attempt.provider].tokens_per_minute
        if tokens_per_minute is not None:
            await self._debit_tokens(attempt.provider, usage, tokens_per_minute)
        if attempt.stop is StopReason.NONE:
            started = row.slot + timedelta(seconds=row.start_lag)  # the claim's own instant
            await self._report_to_breaker(attempt.provider, outcome, probe=probe, started=started)

    def unavailable(self) -> set[str]:
        """Providers this process last saw with their breaker open or paced by their headers:
        a retry with a fallback goes elsewhere where it can."""
        return {p for p, state in self._breaker.items() if state == "open"} | self._paced

    async def _report_to_breaker(
        self, provider: str, outcome: Outcome, *, probe: bool, started: datetime
    ) -> None:
        """Tell the fleet's row of the provider what this attempt met: a throttled answer opens
        the breaker for every replica at once, other retryable failures after BREAKER_FAILURES
        in a row, and neither counts when the attempt started before it last opened (one burst
        is one event); a success restarts the count, closes a half-open breaker when it was the
        probe, and grows the allowed concurrency while it ramps back; headers that said nothing
        is left pace every replica until their reset. Never fails the attempt."""
        try:
            pace = outcome.pace if outcome is not None else None
            if pace is not None:
                await queries.provider_pace(
                    self.pool, self.clock.sql_now(), provider, pace.seconds, pace.header
                )
                self._paced.add(provider)
            if isinstance(outcome, ExecutorError) and outcome.retryable:
                await self._trip(provider, outcome, started)
            elif isinstance(outcome, ExecutionResult) and (
                probe or self._failing.get(provider) or self._ramping.get(provider)
            ):
                ramp = await queries.provider_recover(
                    self.pool, provider, probe=probe, started=started,
                    max_concurrency=self.limiters[provider].max_concurrency,
                    now=self.clock.sql_now(),
                )  # fmt: skip
                self._failing[provider] = False
                self._ramping[provider] = ramp is not None
                if probe:
                    self._set_breaker(provider, "closed")
        except _WRITE_ERRORS as exc:
            self.metrics.role_errors.labels("worker").inc()
            log.warning("provider.breaker_write_failed", provider=provider, error=repr(exc))

    async def _trip(self, provider: str, outcome: ExecutorError, started: datetime) -> None:
        wait = outcome.retry_after
        if wait is None and outcome.pace is not None:
            wait = outcome.pace.seconds
        trip = await queries.provider_trip(
            self.pool, self.clock.sql_now(), provider, wait, started=started,
            throttled=outcome.throttled, threshold=BREAKER_FAILURES, base=BREAKER_BASE,
            throttle_base=THROTTLE_OPEN, cap=BREAKER_MAX, window=THROTTLE_WINDOW,
        )  # fmt: skip
        if trip is not None and trip.opened and trip.open_until is not None:
            self._set_breaker(provider, "open")
            self._child(self.metrics.provider_allowed_concurrency, provider).set(1)
            log.warning("provider.breaker_opened", provider=provider, reason=trip.reason,
                        until=trip.open_until.isoformat(), error=outcome.message)  # fmt: skip

    def _set_breaker(self, provider: str, state: str) -> None:
        self._breaker[provider] = state
        self._child(self.metrics.provider_breaker, provider).set(BREAKER_STATES[state])

    async def _debit_tokens(
        self, provider: str, usage: Mapping[str, Any], tokens_per_minute: int
    ) -> None:
        """Take the tokens an attempt reported, whatever its outcome, from the provider's
        fleet-wide LLM-token bucket. Never fails the attempt."""
        used = usage.get("total_tokens")
        if not isinstance(used, int) or isinstance(used, bool) or used <= 0:
            return
        try:
            await queries.provider_debit_tokens(
                self.pool, self.clock.sql_now(), provider, tokens_per_minute, used
            )
        except _WRITE_ERRORS as exc:
            self.metrics.role_errors.labels("worker").inc()
            log.warning("provider.token_debit_failed", provider=provider,
                        tokens=used, error=repr(exc))  # fmt: skip
