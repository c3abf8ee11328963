"""Every Prometheus object promptsched exports, created in one place (prefix ``promptsched_``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# Event-loop lag: a healthy loop wakes a sleeper within a millisecond or two; anything near a
# second means some request or computation held the loop and every role waited behind it.
_LOOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
LEASE_LOSS_CAUSES = ("expired", "taken", "unreachable")
FENCED_WRITE_KINDS = ("finish", "heartbeat", "transcript", "outbox_mark", "release")


def _counter_per_value(
    registry: CollectorRegistry, name: str, documentation: str, label: str, values: tuple[str, ...]
) -> Counter:
    """A ``promptsched_`` counter with one label whose every series, one per value, exists
    from the start at 0."""
    counter = Counter(name, documentation, [label], namespace="promptsched", registry=registry)
    for value in values:
        counter.labels(value)
    return counter


class Metrics:
    """One registry per process; roles receive it in their constructor."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
        ns = "promptsched"
        self.ticks = Counter(
            "ticks",
            "Slots the scheduler turned into run rows, by outcome (enqueued, skipped, duplicate)",
            ["outcome"],
            namespace=ns,
            registry=registry,
        )
        self.dropped_ticks = Counter(
            "dropped_ticks",
            "Slots that will not run, by reason "
            "(overlap, misfire, catchup_window, disabled, budget)",
            ["reason"],
            namespace=ns,
            registry=registry,
        )
        self.tick_lag = Histogram(
            "tick_lag_seconds",
            "Slot time to run row committed",
            namespace=ns,
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.start_lag = Histogram(
            "start_lag_seconds",
            "Slot time (or retry time) to attempt start",
            namespace=ns,
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.claims = _counter_per_value(
            registry,
            "claims",
            "Claim queries by result: claimed, empty, or contended (runs it wanted and could "
            "have taken were locked by another claimer, whatever it got besides)",
            "result",
            ("claimed", "empty", "contended"),
        )
        self.scheduler_batches = _counter_per_value(
            registry,
            "scheduler_batches",
            "Scheduler batches by result: taken, empty, or contended (due schedules it could "
            "have taken were locked by another scheduler, whatever it took besides)",
            "result",
            ("taken", "empty", "contended"),
        )
        self.leases_renewed = Counter(
            "leases_renewed", "Leases renewed by heartbeats", namespace=ns, registry=registry
        )
        self.leases_lost = _counter_per_value(
            registry,
            "leases_lost",
            "Attempts stopped because their lease was gone, by cause: expired (not renewed for "
            "a lease, then taken back), taken (taken back while the lease should have held), "
            "unreachable (heartbeats failed for a lease; stopped locally)",
            "cause",
            LEASE_LOSS_CAUSES,
        )
        self.leases_reaped = Counter(
            "leases_reaped",
            "Expired leases the reaper took back, by outcome (retry, dead)",
            ["outcome"],
            namespace=ns,
            registry=registry,
        )
        self.leases_released = Counter(
            "leases_released", "Leases handed back on shutdown", namespace=ns, registry=registry
        )
        self.fenced_writes = _counter_per_value(
            registry,
            "fenced_writes",
            "Writes attempted and rejected because their attempt or claim token was no longer "
            "current, by kind (finish, heartbeat, transcript, outbox_mark, release)",
            "kind",
            FENCED_WRITE_KINDS,
        )
        self.run_duration = Histogram(
            "run_duration_seconds",
            "Attempt duration by provider and outcome",
            ["provider", "outcome"],
            namespace=ns,
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.runs_finished = Counter(
            "runs_finished",
            "Runs that reached a final state, by status",
            ["status"],
            namespace=ns,
            registry=registry,
        )
        self.retries = Counter(
            "retries",
            "Attempts that failed and were scheduled again",
            ["provider"],
            namespace=ns,
            registry=registry,
        )
        self.dead_letters = Counter(
            "dead_letters", "Runs that went dead", ["provider"], namespace=ns, registry=registry
        )
        # The database-derived gauges below are set only by the stats leader (one replica);
        # every other replica exports no series for them, so sum() over replicas is exact.
        self.queue_depth = Gauge(
            "queue_depth",
            "Unfinished runs by status: pending (claimable now), scheduled (pending with a "
            "future available_at: retry backoff or jitter), running",
            ["status"],
            namespace=ns,
            registry=registry,
        )
        self.oldest_pending_age = Gauge(
            "oldest_pending_age_seconds",
            "How long the oldest claimable pending run has waited, by provider",
            ["provider"],
            namespace=ns,
            registry=registry,
        )
        self.stuck_runs = Gauge(
            "stuck_runs",
            "Running runs the reaper has not yet taken back, by reason (lease_expired, "
            "deadline_passed)",
            ["reason"],
            namespace=ns,
            registry=registry,
        )
        self.outbox_depth = Gauge(
            "outbox_depth",
            "Undelivered notifications by status (pending, sending, dead)",
            ["status"],
            namespace=ns,
            registry=registry,
        )
        self.stats_leader = Gauge(
            "stats_leader",
            "1 when this replica leads the stats duty and exports the database-derived gauges",
            namespace=ns,
            registry=registry,
        )
        self.deliveries = Counter(
            "deliveries",
            "Notification delivery attempts by channel and outcome (delivered, retry, dead, "
            "lost, fenced, released)",
            ["channel", "outcome"],
            namespace=ns,
            registry=registry,
        )
        self.delivery_duration = Histogram(
            "delivery_duration_seconds",
            "Time one notification send took, by channel",
            ["channel"],
            namespace=ns,
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.notification_lag = Histogram(
            "notification_lag_seconds",
            "Run finished (notification owed) to notification sent",
            ["channel"],
            namespace=ns,
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.worker_slots = Gauge(
            "worker_slots",
            "Worker slots of this process by state (busy, idle)",
            ["state"],
            namespace=ns,
            registry=registry,
        )
        self.provider_in_flight = Gauge(
            "provider_in_flight",
            "Running runs of a provider across the whole fleet, as this process last counted "
            "them when it claimed under the provider's fleet-wide limits",
            ["provider"],
            namespace=ns,
            registry=registry,
        )
        self.llm_tokens = Counter(
            "llm_tokens",
            "Tokens the providers reported, by provider, model and kind (prompt, completion), "
            "for every attempt that reported usage, whatever its outcome",
            ["provider", "model", "kind"],
            namespace=ns,
            registry=registry,
        )
        self.llm_cost = Counter(
            "llm_cost",
            "What those tokens cost by the server's price table (PROMPTSCHED_PRICES), in its "
            "currency unit (USD in the docs), by provider and model",
            ["provider", "model"],
            namespace=ns,
            registry=registry,
        )
        self.provider_breaker = Gauge(
            "provider_breaker_state",
            "A provider's fleet-wide circuit breaker as this process last saw it: 0 closed, "
            "1 half-open (one probe at a time), 2 open (no request is sent)",
            ["provider"],
            namespace=ns,
            registry=registry,
        )
        self.throttled_claims = Counter(
            "provider_throttled_claims",
            "Claims that took nothing because a provider's fleet-wide limit was reached, by "
            "the limit (concurrency, rate, tokens: tokens per minute, open: its breaker); the runs "
            "wait as pending rows",
            ["provider", "reason"],
            namespace=ns,
            registry=registry,
        )
        self.role_errors = Counter(
            "role_errors",
            "Unexpected errors a role survived (it retries with backoff)",
            ["role"],
            namespace=ns,
            registry=registry,
        )
        self.runs_purged = Counter(
            "runs_purged",
            "Finished runs deleted by history retention",
            namespace=ns,
            registry=registry,
        )
        self.scheduler_alive = Gauge(
            "scheduler_last_tick_timestamp_seconds",
            "Unix time of this process's last scheduler loop",
            namespace=ns,
            registry=registry,
        )
        self.event_loop_lag = Histogram(
            "event_loop_lag_seconds",
            "How much later than asked a periodic probe's sleep woke up: how long the event "
            "loop was held by other work (every role and request of the process shares it)",
            namespace=ns,
            buckets=_LOOP_BUCKETS,
            registry=registry,
        )
        # The listener's self-check (store/listen.py): a test NOTIFY sent through the pool must
        # come back on the LISTEN connection, or wake-ups are silently lost.
        self.listener_checks = Counter(
            "listener_checks",
            "Listener self-checks by result (ok: the test notification arrived; lost: it did "
            "not within the timeout, so wake-ups are not arriving)",
            ["result"],
            namespace=ns,
            registry=registry,
        )
        self.listener_healthy = Gauge(
            "listener_healthy",
            "0 while the listener's last self-check notification did not arrive (wake-ups are "
            "lost and the replica reports not ready), else 1",
            namespace=ns,
            registry=registry,
        )
        self.listener_healthy.set(1)


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
