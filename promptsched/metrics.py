"""Every Prometheus object promptsched exports, created in one place (prefix ``promptsched_``),
with every label value it can take.

A labelled metric names the values of each label: a tuple of words, or ``PROVIDERS`` (the
configured providers) or ``MODELS`` (a provider's bounded models: its priced models, its
default model, ``other``), filled in by ``Metrics.know`` at startup. Every series of those
values exists at 0 from then on, so ``increase()`` and ``rate()`` see the first event
(docs/observability.md, "First events"); the label values are written into the help text, and
tests/test_observability.py keeps both in agreement with the docs. A new label value goes
into its tuple here, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import product
from typing import Any, Final

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.metrics import MetricWrapperBase

# No ``*_created`` series: nothing reads them, and they double every counter's series.
disable_created_metrics()  # type: ignore[no-untyped-call]

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Event-loop lag: a healthy loop wakes a sleeper within a millisecond or two; anything near a
# second means some request or computation held the loop and every role waited behind it.
_LOOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

# Label domains known only from the configuration (Metrics.know).
PROVIDERS: Final = "the configured providers"
MODELS: Final = "the provider's priced and default models, default (none named), other"
OTHER_PROVIDERS: Final = "the configured providers other than the first"
OTHER_MODEL = "other"
Values = tuple[str, ...] | str

# --- every label value, one tuple per meaning ------------------------------------------------
TICK_OUTCOMES = ("enqueued", "skipped", "duplicate")
DROP_REASONS: tuple[str, ...] = ("overlap", "misfire", "catchup_window", "disabled", "budget")
DROP_REASONS += ("cancelled_by_overlap",)
CLAIM_RESULTS = ("claimed", "empty", "contended")
BATCH_RESULTS = ("taken", "empty", "contended")
LEASE_LOSS_CAUSES = ("expired", "taken", "unreachable")
REAP_OUTCOMES = ("retry", "dead", "cancelled")
FENCED_WRITE_KINDS = ("finish", "heartbeat", "transcript", "outbox_mark", "release")
ATTEMPT_OUTCOMES = ("succeeded", "failed", "cancelled")
FINAL_STATUSES = ("succeeded", "dead", "cancelled", "skipped")
CHANNELS = ("email", "webhook", "slack", "discord", "ntfy")
DELIVERY_OUTCOMES = ("delivered", "retry", "dead", "lost", "fenced", "released")
SLOT_STATES = ("busy", "idle")
TOKEN_KINDS = ("prompt", "completion")
THROTTLE_REASONS = ("concurrency", "rate", "tokens", "open", "paced", "ramp")
ROLES: tuple[str, ...] = ("scheduler", "worker", "heartbeat", "transcript", "notifier", "reaper")
ROLES += ("retention", "stats", "presence")
LISTENER_RESULTS = ("ok", "lost")
HTTP_REFUSALS = ("over_cap", "overflow")  # api/protocol.py: answered 503, or closed unanswered
REQUEST_PHASES = ("headers", "body")
# The stats leader's gauges (roles/stats.py): only the leader exports them.
QUEUE_STATUSES = ("pending", "waiting_predecessor", "held_by_provider", "scheduled", "running")
HOLD_REASONS = ("open", "concurrency", "rate", "tokens")
STUCK_REASONS = ("lease_expired", "deadline_passed")
OUTBOX_STATUSES = ("pending", "sending", "dead")


class Metrics:
    """One registry per process; roles receive it in their constructor."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        # metric -> its label domains, and whether its series exist from startup
        self.domains: dict[MetricWrapperBase, tuple[dict[str, Values], bool]] = {}
        self._models: dict[str, tuple[str, ...]] = {}
        self._known_models: dict[str, frozenset[str]] = {}
        self._scheduling()
        self._work()
        self._database()
        self._delivery()
        self._providers()
        self._process()
        self._http()
        self.know({})

    # --- construction ---------------------------------------------------------------------

    def _metric(
        self,
        kind: type[Any],
        name: str,
        help_: str,
        labels: Mapping[str, Values],
        *,
        zero: bool = True,
        **kw: Any,
    ) -> Any:
        said = "; ".join(
            f"{label}: {', '.join(values) if isinstance(values, tuple) else values}"
            for label, values in labels.items()
        )
        metric = kind(
            name,
            f"{help_} ({said})" if said else help_,
            list(labels),
            namespace="promptsched",
            registry=self.registry,
            **kw,
        )
        if labels:
            self.domains[metric] = (dict(labels), zero)
        return metric

    def _counter(self, name: str, help_: str, **labels: Values) -> Counter:
        counter: Counter = self._metric(Counter, name, help_, labels)
        return counter

    def _histogram(
        self, name: str, help_: str, buckets: Sequence[float], **labels: Values
    ) -> Histogram:
        histogram: Histogram = self._metric(Histogram, name, help_, labels, buckets=buckets)
        return histogram

    def _gauge(self, name: str, help_: str, *, zero: bool = True, **labels: Values) -> Gauge:
        """``zero=False``: a gauge whose value is unknown until it is set (the stats leader's,
        which no other replica exports; a provider's state as a claim last saw it)."""
        gauge: Gauge = self._metric(Gauge, name, help_, labels, zero=zero)
        return gauge

    # --- the families -----------------------------------------------------------------------

    def _scheduling(self) -> None:
        self.ticks = self._counter(
            "ticks", "Slots the scheduler turned into run rows, by outcome", outcome=TICK_OUTCOMES
        )
        self.dropped_ticks = self._counter(
            "dropped_ticks", "Slots that will not run, by reason", reason=DROP_REASONS
        )
        self.runs_deferred = self._counter(
            "runs_deferred",
            "Runs written pending for a later minute: their owner's schedules had made "
            "PROMPTSCHED_OWNER_RUNS_PER_MINUTE runs due in this one",
        )
        self.tick_lag = self._histogram(
            "tick_lag_seconds", "Slot time to run row committed", _LAG_BUCKETS
        )
        self.start_lag = self._histogram(
            "start_lag_seconds", "Slot time (or retry time) to attempt start", _LAG_BUCKETS
        )
        self.scheduler_batches = self._counter(
            "scheduler_batches",
            "Scheduler batches by result (contended: due schedules it could have taken were "
            "locked by another scheduler, whatever it took besides)",
            result=BATCH_RESULTS,
        )
        self.scheduler_alive = self._gauge(
            "scheduler_last_tick_timestamp_seconds",
            "Unix time of this process's last scheduler loop",
        )

    def _work(self) -> None:
        self.claims = self._counter(
            "claims",
            "Claim queries by result (contended: runs it wanted and could have taken were "
            "locked by another claimer, whatever it got besides)",
            result=CLAIM_RESULTS,
        )
        self.leases_renewed = self._counter("leases_renewed", "Leases renewed by heartbeats")
        self.final_write_seconds = self._histogram(
            "final_write_seconds",
            "One batched final write (run_finish_many) of this process's attempts: its round "
            "trip and its commit",
            _LOOP_BUCKETS,
        )
        self.leases_lost = self._counter(
            "leases_lost",
            "Attempts stopped because their lease was gone, by cause: expired (not renewed for "
            "a lease, then taken back), taken (taken back while the lease should have held), "
            "unreachable (heartbeats failed for a lease; stopped locally)",
            cause=LEASE_LOSS_CAUSES,
        )
        self.leases_reaped = self._counter(
            "leases_reaped",
            "Expired leases the reaper took back, by the run's outcome",
            outcome=REAP_OUTCOMES,
        )
        self.leases_released = self._counter("leases_released", "Leases handed back on shutdown")
        self.fenced_writes = self._counter(
            "fenced_writes",
            "Writes attempted and rejected because their attempt or claim token was no longer "
            "current, by kind",
            kind=FENCED_WRITE_KINDS,
        )
        self.run_duration = self._histogram(
            "run_duration_seconds",
            "Attempt duration by provider and outcome",
            _DURATION_BUCKETS,
            provider=PROVIDERS,
            outcome=ATTEMPT_OUTCOMES,
        )
        self.runs_finished = self._counter(
            "runs_finished", "Runs that reached a final state, by status", status=FINAL_STATUSES
        )
        self.retries = self._counter(
            "retries", "Attempts that failed and were scheduled again", provider=PROVIDERS
        )
        self.dead_letters = self._counter("dead_letters", "Runs that went dead", provider=PROVIDERS)
        self.worker_slots = self._gauge(
            "worker_slots", "Worker slots of this process by state", state=SLOT_STATES
        )
        self.runs_purged = self._counter(
            "runs_purged", "Finished runs deleted by history retention"
        )

    def _database(self) -> None:
        # Set only by the stats leader (one replica); every other replica exports no series
        # for them, so sum() over replicas is exact.
        self.queue_depth = self._gauge(
            "queue_depth",
            "Unfinished runs by status: pending (a replica could claim it now), "
            "waiting_predecessor (behind an earlier run of its schedule, overlap buffer_*), "
            "held_by_provider (its provider's fleet-wide limits or breaker leave no room), "
            "scheduled (due later: retry backoff, jitter), running",
            zero=False,
            status=QUEUE_STATUSES,
        )
        self.oldest_pending_age = self._gauge(
            "oldest_pending_age_seconds",
            "How long the oldest run a replica could claim now has waited to be claimable, by "
            "provider (0: none)",
            zero=False,
            provider=PROVIDERS,
        )
        self.held_runs = self._gauge(
            "held_runs",
            "Due runs their provider's fleet-wide limits or breaker hold back, by provider and "
            "the limit that binds",
            zero=False,
            provider=PROVIDERS,
            reason=HOLD_REASONS,
        )
        self.stuck_runs = self._gauge(
            "stuck_runs",
            "Running runs the reaper has not yet taken back, by reason",
            zero=False,
            reason=STUCK_REASONS,
        )
        self.outbox_depth = self._gauge(
            "outbox_depth",
            "Undelivered notifications by status",
            zero=False,
            status=OUTBOX_STATUSES,
        )
        self.stats_leader = self._gauge(
            "stats_leader",
            "1 when this replica leads the stats duty and exports the database-derived gauges",
        )
        # The fleet (roles/presence.py): every replica reads the replicas table each interval.
        self.replicas = self._gauge(
            "replicas",
            "Live replicas (each publishes its configuration in the replicas table), as this "
            "replica last read them",
        )
        self.config_fingerprints = self._gauge(
            "config_fingerprints",
            "Different configuration fingerprints the live replicas publish (1: they agree)",
        )
        self.config_drift = self._gauge(
            "config_drift",
            "1 while the live replicas publish more than one configuration fingerprint "
            "(`promptsched status` shows what differs), else 0",
        )
        self.config_info = self._gauge(
            "config_info",
            "1, labelled with this replica's version and configuration fingerprint",
            zero=False,
            version="this replica's version",
            fingerprint="its configuration fingerprint",
        )

        self.build_info = self._gauge(
            "build_info",
            "1, labelled with this process's release: its version, the git commit it was built "
            "from, and the schema version it was built for",
            zero=False,
            version="this process's version",
            commit="the git commit it was built from (unknown when the build could not tell)",
            schema="the schema version it was built for",
        )

    def _delivery(self) -> None:
        self.deliveries = self._counter(
            "deliveries",
            "Notification delivery attempts by channel and outcome",
            channel=CHANNELS,
            outcome=DELIVERY_OUTCOMES,
        )
        self.delivery_duration = self._histogram(
            "delivery_duration_seconds",
            "Time one notification send took, by channel",
            _LAG_BUCKETS,
            channel=CHANNELS,
        )
        self.notification_lag = self._histogram(
            "notification_lag_seconds",
            "Run finished (notification owed) to notification sent",
            _LAG_BUCKETS,
            channel=CHANNELS,
        )

    def _providers(self) -> None:
        self.provider_in_flight = self._gauge(
            "provider_in_flight",
            "Calls of a provider in flight across the whole fleet (its running runs, less this "
            "process's whose call returned and whose final write is on its way), as this "
            "process last counted them when it claimed under the provider's fleet-wide limits",
            zero=False,
            provider=PROVIDERS,
        )
        self.llm_tokens = self._counter(
            "llm_tokens",
            "Tokens the providers reported, by provider, model and kind, for every attempt "
            "that reported usage, whatever its outcome",
            provider=PROVIDERS,
            model=MODELS,
            kind=TOKEN_KINDS,
        )
        self.llm_cost = self._counter(
            "llm_cost",
            "What those tokens cost by the server's price table (PROMPTSCHED_PRICES), in its "
            "currency unit (USD in the docs), by provider and model",
            provider=PROVIDERS,
            model=MODELS,
        )
        self.provider_breaker = self._gauge(
            "provider_breaker_state",
            "A provider's fleet-wide circuit breaker as this process last saw it: 0 closed, "
            "1 half-open (one probe at a time), 2 open (no request is sent)",
            zero=False,
            provider=PROVIDERS,
        )
        self.throttled_claims = self._counter(
            "provider_throttled_claims",
            "Claims that took nothing because a provider's fleet-wide limit was reached, by "
            "the limit (tokens: tokens per minute, open: its breaker, paced: its own rate-limit "
            "headers, ramp: its concurrency ramping back after the breaker opened); the runs "
            "wait as pending rows",
            provider=PROVIDERS,
            reason=THROTTLE_REASONS,
        )
        self.provider_allowed_concurrency = self._gauge(
            "provider_allowed_concurrency",
            "Requests a provider may have in flight across the whole fleet right now, as this "
            "process last read it: its max_concurrency, or less while the concurrency ramps "
            "back from one after its breaker opened",
            zero=False,
            provider=PROVIDERS,
        )
        self.throttled_attempts = self._counter(
            "provider_throttled_attempts",
            "Attempts a provider answered with 'not now' (a 429, a 503 with Retry-After): the "
            "run waits as asked and the attempt does not count against max_attempts",
            provider=PROVIDERS,
        )
        self.provider_fallbacks = self._counter(
            "provider_fallbacks",
            "Runs whose next attempt went to another provider of their schedule's route after "
            "a retryable failure or throttling, by the provider left and the one taken",
            from_provider=PROVIDERS,
            to_provider=OTHER_PROVIDERS,
        )

    def _process(self) -> None:
        self.role_errors = self._counter(
            "role_errors",
            "Unexpected errors a role survived (it retries with backoff)",
            role=ROLES,
        )
        self.event_loop_lag = self._histogram(
            "event_loop_lag_seconds",
            "How much later than asked a periodic probe's sleep woke up: how long the event "
            "loop was held by other work (every role and request of the process shares it)",
            _LOOP_BUCKETS,
        )
        # The listener's self-check (store/listen.py): a test NOTIFY sent through the pool must
        # come back on the LISTEN connection, or wake-ups are silently lost.
        self.listener_checks = self._counter(
            "listener_checks",
            "Listener self-checks by result (ok: the test notification arrived; lost: it did "
            "not within the timeout, so wake-ups are not arriving)",
            result=LISTENER_RESULTS,
        )
        self.listener_healthy = self._gauge(
            "listener_healthy",
            "0 while the listener's last self-check notification did not arrive (wake-ups are "
            "lost and the replica reports not ready), else 1",
        )
        self.listener_healthy.set(1)

    def _http(self) -> None:
        # The API's connections (api/protocol.py, docs/deploying.md#connections-are-bounded).
        self.http_connections = self._gauge(
            "http_connections",
            "Client connections the API holds open now within its cap "
            "(PROMPTSCHED_HTTP_MAX_CONNECTIONS, at most half the open-files limit)",
        )
        self.http_connections_refused = self._counter(
            "http_connections_refused",
            "New connections turned away because the API's connection cap was reached, by "
            "reason: over_cap (answered 503 busy at once), overflow (past the cap's overflow, "
            "closed unanswered) (reason: over_cap, overflow)",
            reason=HTTP_REFUSALS,
        )
        self.http_request_timeouts = self._counter(
            "http_request_timeouts",
            "Requests answered 408 and closed because their headers or their body did not "
            "arrive in time (phase: headers, body)",
            phase=REQUEST_PHASES,
        )

    # --- the known label values -----------------------------------------------------------

    def know(self, models: Mapping[str, Sequence[str]]) -> None:
        """Create at 0 every series of every label value this process can know: the fixed
        words, and per configured provider (``models``: provider -> its bounded models, see
        ``prices.Prices.models``) its series. Called once the configuration is read; a gauge
        with ``zero=False`` is left alone (its value is unknown until it is set)."""
        self._models = {provider: (*names, OTHER_MODEL) for provider, names in models.items()}
        self._known_models = {provider: frozenset(names) for provider, names in models.items()}
        for metric, (labels, zero) in self.domains.items():
            if zero:
                for values in self.values(labels):
                    metric.labels(*values)

    def values(self, labels: Mapping[str, Values]) -> Iterator[tuple[str, ...]]:
        """Every combination of known values of ``labels`` (a model follows its provider)."""
        fixed = [values if isinstance(values, tuple) else () for values in labels.values()]
        kinds = list(labels.values())
        if PROVIDERS not in kinds:
            yield from product(*fixed)
            return
        for provider, models in self._models.items():
            others = tuple(p for p in self._models if p != provider)
            parts = [
                (provider,) if kind == PROVIDERS
                else models if kind == MODELS
                else others if kind == OTHER_PROVIDERS
                else fixed[i]
                for i, kind in enumerate(kinds)
            ]  # fmt: skip
            yield from product(*parts)

    def model(self, provider: str, model: str) -> str:
        """The ``model`` label of a run's model: itself when known for its provider, else
        ``other``, so no schedule can create a series. A dictionary and a set lookup, no
        allocation: it runs once per attempt that reported usage."""
        return model if model in self._known_models.get(provider, ()) else OTHER_MODEL


class Children:
    """``metric.labels(*values)``, looked up once per process: a label lookup per run adds up
    at thousands of runs a second."""

    def __init__(self) -> None:
        self._children: dict[tuple[object, ...], Any] = {}

    def __call__(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child
