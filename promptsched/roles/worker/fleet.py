"""The fleet-wide limits of a provider as one process meets them: the claim they admit (one
statement under the provider's advisory lock, docs/providers.md), how long to wait while they
bind, and what each attempt reports back to the provider's shared row (the tokens it used, and
its success or failure for the circuit breaker)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
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
from promptsched.roles.worker.heartbeat import InFlight, StopReason
from promptsched.store import queries

log = structlog.get_logger("worker")

# The fleet's circuit breaker of a provider (docs/providers.md): a 429 with Retry-After opens it
# for that long; otherwise BREAKER_FAILURES retryable failures in a row open it for
# BREAKER_BASE seconds, doubling per further failure up to BREAKER_MAX.
BREAKER_FAILURES = 5
BREAKER_BASE = 30.0
BREAKER_MAX = 300.0
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
        self._probes: set[int] = set()  # runs claimed as a half-open breaker's probe

    async def claim(
        self, provider: str, want: int, worker_id: str, lease: timedelta
    ) -> queries.Claim:
        """Claim at most what the provider's limits leave for the whole fleet: its running runs
        (every replica's) below ``max_concurrency``, whole tokens of its shared rate bucket, a
        positive LLM-token bucket, nothing while its breaker is open and one probe while
        half-open. One statement: it takes the provider's advisory lock, so two replicas never
        both fill the last free place (docs/providers.md)."""
        limiter = self.limiters[provider]
        claim = await queries.run_claim_limited(
            self.pool, self.clock.sql_now(), provider, want, worker_id, lease,
            max_concurrency=limiter.max_concurrency, rate=limiter.rate_per_second,
            burst=limiter.burst, tokens_per_minute=limiter.tokens_per_minute,
        )  # fmt: skip
        room = claim.room
        state = "open" if room.open_for > 0 else "half_open" if room.half_open else "closed"
        self._set_breaker(provider, state)
        self._failing[provider] = room.failures > 0
        self._child(self.metrics.provider_in_flight, provider).set(room.running + len(claim))
        if room.allowed <= 0:
            reason = (
                "open" if state == "open"
                else "tokens" if room.llm_tokens is not None and room.llm_tokens <= 0
                else "concurrency" if room.running >= limiter.max_concurrency
                or state == "half_open" else "rate"
            )  # fmt: skip
            self._child(self.metrics.throttled_claims, provider, reason).inc()
            self.waits[provider] = self._backoff(provider, limiter, room, reason)
        else:
            self.waits.pop(provider, None)
        if state == "half_open":
            self._probes.update(row.id for row in claim)
        return claim

    def _backoff(
        self, provider: str, limiter: Limiter, room: queries.ProviderRoom, reason: str
    ) -> float:
        """How long to wait before asking a throttled provider again: until its breaker
        half-opens, until its next rate token, until its LLM-token bucket is positive again, or
        (when full) 50 ms doubling to 1 s, since another replica's finish does not wake this
        one."""
        if reason == "open":
            return max(0.05, room.open_for)
        if reason == "tokens" and room.llm_tokens is not None and limiter.tokens_per_minute:
            return max(0.01, -room.llm_tokens / (limiter.tokens_per_minute / 60))
        if reason == "rate" and limiter.rate_per_second is not None:
            return max(0.01, 1.0 / limiter.rate_per_second)
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
            await self._report_to_breaker(attempt.provider, outcome, probe=probe)

    async def _report_to_breaker(self, provider: str, outcome: Outcome, *, probe: bool) -> None:
        """Tell the fleet's breaker of the provider what this attempt met: a 429 with
        Retry-After opens it for every replica at once; other retryable failures open it after
        BREAKER_FAILURES in a row; a success restarts the count, and a half-open probe's
        success closes it. Never fails the attempt."""
        try:
            if isinstance(outcome, ExecutorError) and outcome.retryable:
                until = await queries.provider_trip(
                    self.pool, self.clock.sql_now(), provider, outcome.retry_after,
                    threshold=BREAKER_FAILURES, base=BREAKER_BASE, cap=BREAKER_MAX,
                )  # fmt: skip
                if until is not None and self._breaker.get(provider) != "open":
                    self._set_breaker(provider, "open")
                    log.warning("provider.cooling_down", provider=provider,
                                until=until.isoformat(), error=outcome.message)  # fmt: skip
            elif isinstance(outcome, ExecutionResult) and (probe or self._failing.get(provider)):
                await queries.provider_recover(self.pool, provider, probe=probe)
                self._failing[provider] = False
                if probe:
                    self._set_breaker(provider, "closed")
        except _WRITE_ERRORS as exc:
            self.metrics.role_errors.labels("worker").inc()
            log.warning("provider.breaker_write_failed", provider=provider, error=repr(exc))

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
