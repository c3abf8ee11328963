"""The stats role owns the database-derived gauges: the one replica leading the ``stats`` duty
reads queue depth, oldest claimable age, held runs, stuck runs and outbox depth for the whole
fleet. The waiting runs are split by what holds them, so ``queue_depth{status="pending"}``
counts only runs a replica could claim now (docs/observability.md, "What waits")."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.clock import Clock
from promptsched.executors.limiter import Limiter
from promptsched.metrics import HOLD_REASONS, OUTBOX_STATUSES, PROVIDERS, STUCK_REASONS, Metrics
from promptsched.roles.loop import Wakeup, run_forever
from promptsched.store import queries

log = structlog.get_logger("stats")

DUTY = "stats"


class Snapshot:
    """One refresh's figures, published at once."""

    def __init__(self, providers: Sequence[str]) -> None:
        self.depth = dict.fromkeys(("waiting_predecessor", "scheduled", "running"), 0)
        self.ready: dict[str, int] = dict.fromkeys(providers, 0)
        self.age: dict[str, float] = dict.fromkeys(providers, 0.0)
        self.held = {(p, reason): 0 for p in providers for reason in HOLD_REASONS}
        self.stuck: dict[str, int] = {}
        self.outbox: dict[str, int] = {}

    def hold(self, provider: str, reason: str, runs: int) -> None:
        self.held[provider, reason] = runs
        self.ready[provider] -= runs
        if self.ready[provider] <= 0:
            self.age[provider] = 0.0  # claims take the oldest first: none is claimable


def binding_limit(room: asyncpg.Record, max_concurrency: int) -> str:
    """Which of a provider's fleet-wide limits leaves less room than its ready runs want, as
    ``provider_admit`` decides: its breaker, its LLM-token bucket, its running runs or its
    request-rate bucket."""
    if room["open_for"] > 0:
        return "open"
    if room["llm_tokens"] is not None and room["llm_tokens"] <= 0:
        return "tokens"
    concurrency = (1 if room["half_open"] else max_concurrency) - room["running"]
    rate = math.inf if room["tokens"] is None else math.floor(room["tokens"] + 1e-9)
    return "concurrency" if concurrency <= rate else "rate"


class Stats:
    """Every ``interval``, the leader renews its term and refreshes the gauges; the other
    replicas try to take the duty and otherwise export no series for those gauges, so N
    replicas cost one replica's queries.

    Leadership is a row in ``leaders`` with an expiry of Postgres's clock, taken and renewed
    by one statement on a pooled connection (docs/deploying.md says why not a session lock):
    it works through a transaction pooler, and a leader that crashed or froze loses the duty
    when its ``term`` runs out without a renewal. The leader believes in its term only until
    ``term`` after it sent the renewal (a local monotonic deadline, never compared with a
    database time); the database's expiry is ``term`` after the renewal arrived, later still.
    So a replica stops calling itself leader before another can take over: never two at once.
    """

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        clock: Clock,
        metrics: Metrics,
        *,
        holder: str = "promptsched",
        interval: timedelta = timedelta(seconds=5),
        term: timedelta = timedelta(seconds=15),
        query_timeout: timedelta = timedelta(seconds=10),
        limiters: Mapping[str, Limiter] | None = None,
    ) -> None:
        if term <= interval:
            raise ValueError("the term must outlast the renewal interval")
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        # Unique per process lifetime: a restarted replica never renews its predecessor's term.
        self.holder = f"{holder}/{secrets.token_hex(4)}"
        self.interval = interval
        self.term = term
        self.query_timeout = query_timeout
        # The providers whose limits hold for the whole fleet: their room decides what is
        # claimable (a per-process limit is no reason against another replica).
        self.limits = {
            name: queries.ProviderLimits(
                limiter.max_concurrency, limiter.rate_per_second, limiter.burst,
                limiter.tokens_per_minute,
            )
            for name, limiter in (limiters or {}).items()
            if limiter.fleet
        }  # fmt: skip
        self.wakeup = Wakeup()
        self._term_number: int | None = None
        self._believe_until = 0.0  # time.monotonic() deadline of the current term
        self._acquired = False  # ever led: a stop releases the row
        self._clear()
        # Read at scrape time, so a replica whose term ran out (frozen, or its renewals
        # failing) stops saying it leads even before its next tick.
        metrics.stats_leader.set_function(lambda: 1.0 if self.leader else 0.0)

    @property
    def leader(self) -> bool:
        return self._term_number is not None and time.monotonic() < self._believe_until

    async def run_once(self) -> bool:
        """Take or renew the duty and, as leader, refresh the gauges; True while leader."""
        sent = time.monotonic()
        try:
            with anyio.fail_after(self.query_timeout.total_seconds()):
                number = await queries.leader_acquire(
                    self.pool, DUTY, self.holder, self.term, self.clock.sql_now()
                )
                if number is None:
                    self._step_down("taken")
                    return False
                if number != self._term_number:
                    log.info("stats.leader_acquired", holder=self.holder, term=number)
                self._term_number, self._acquired = number, True
                self._believe_until = sent + self.term.total_seconds()
                await self._refresh()
            return self.leader
        except Exception:
            # A renewal that failed may let the term run out: stop exporting now.
            self._step_down("error")
            raise
        except BaseException:
            self._step_down(None)
            raise

    async def close(self) -> None:
        """Step down (releasing the duty for another replica at once) and stop exporting."""
        self._step_down(None)
        if not self._acquired:
            return
        self._acquired = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await queries.leader_release(self.pool, DUTY, self.holder)
            except Exception as exc:  # the term then simply runs out
                log.warning("stats.release_failed", holder=self.holder, error=repr(exc))
            else:
                log.info("stats.leader_released", holder=self.holder)

    def _step_down(self, reason: str | None) -> None:
        if self._term_number is not None and reason is not None:
            log.warning("stats.leader_lost", holder=self.holder, reason=reason)
        self._term_number = None
        self._clear()

    async def _refresh(self) -> None:
        now = self.clock.sql_now()
        known = [values[0] for values in self.metrics.values({"provider": PROVIDERS})]
        snap = Snapshot(known)
        async with self.pool.acquire() as conn:
            depth = await queries.stats_queue_depth(conn, now)
            for row in await queries.stats_pending_runs(conn, now):
                provider = row["provider"]
                snap.depth["scheduled"] += row["scheduled"]
                snap.depth["waiting_predecessor"] += row["waiting"]
                snap.ready[provider] = row["ready"]
                snap.age[provider] = max(0.0, row["oldest_ready"]) if row["ready"] else 0.0
                snap.held.update({(provider, reason): 0 for reason in HOLD_REASONS})
            wanted = {
                name: (snap.ready[name], limits)
                for name, limits in self.limits.items()
                if snap.ready.get(name)
            }
            if wanted:
                for room in await queries.stats_provider_room(conn, now, wanted):
                    name = room["provider"]
                    held = snap.ready[name] - room["allowed"]
                    if held > 0:
                        reason = binding_limit(room, self.limits[name].max_concurrency)
                        snap.hold(name, reason, held)
            outbox = await queries.stats_outbox_depth(conn)
        snap.depth["running"] = depth["running"]
        snap.stuck = {reason: depth[reason] for reason in STUCK_REASONS}
        counted = {row["status"]: row["count"] for row in outbox}
        snap.outbox = {status: counted.get(status, 0) for status in OUTBOX_STATUSES}
        if self.leader:  # still within the term after the queries
            self._publish(snap)

    def _publish(self, snap: Snapshot) -> None:
        # No await in here: a scrape sees the previous refresh or this one, never a mix.
        metrics = self.metrics
        depth = metrics.queue_depth
        depth.labels("pending").set(sum(snap.ready.values()))
        depth.labels("held_by_provider").set(sum(snap.held.values()))
        for status, count in snap.depth.items():
            depth.labels(status).set(count)
        for provider, age in snap.age.items():
            metrics.oldest_pending_age.labels(provider).set(age)
        for (provider, reason), count in snap.held.items():
            metrics.held_runs.labels(provider, reason).set(count)
        for reason, count in snap.stuck.items():
            metrics.stuck_runs.labels(reason).set(count)
        for status, count in snap.outbox.items():
            metrics.outbox_depth.labels(status).set(count)

    def _clear(self) -> None:
        metrics = self.metrics
        for gauge in (
            metrics.queue_depth,
            metrics.oldest_pending_age,
            metrics.held_runs,
            metrics.stuck_runs,
            metrics.outbox_depth,
        ):
            gauge.clear()

    async def _tick(self) -> float:
        await self.run_once()
        return self.interval.total_seconds()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await run_forever("stats", self._tick, self.wakeup, self.metrics)
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()
