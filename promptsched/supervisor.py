"""The composition root: builds the pool, clock, metrics and roles, starts each in one task
group, and turns SIGTERM into a two-phase stop (drain, then cancel)."""

from __future__ import annotations

import resource
import secrets
import signal
import socket
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup

import promptsched
from promptsched import eventloop, heap
from promptsched.api import app as api_app
from promptsched.api import protocol
from promptsched.clock import Clock
from promptsched.config import Config
from promptsched.console import routes as console
from promptsched.executors.providers import build_registry
from promptsched.executors.settings import ProviderSettings, parse_providers
from promptsched.mcpserver import http as mcp_http
from promptsched.metrics import Metrics
from promptsched.monitor import patterns as output_patterns
from promptsched.ops import doctor, fleet
from promptsched.ops import serving as announcement
from promptsched.roles.loop import Rush
from promptsched.roles.loop_probe import LoopProbe
from promptsched.roles.notifier import Notifier, build_senders
from promptsched.roles.presence import Presence
from promptsched.roles.reaper import Reaper
from promptsched.roles.retention import Retention
from promptsched.roles.scheduler import Scheduler
from promptsched.roles.stats import Stats
from promptsched.roles.worker import WorkerPool, default_worker_id
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.store import listen, migrate, queries
from promptsched.store import pool as pools
from promptsched.tools.registry import ToolRegistry
from promptsched.tools.settings import parse_mcp_servers
from promptsched.web.edge import Edge
from promptsched.web.progress import ProgressHub
from promptsched.web.ratelimit import TokenRates

log = structlog.get_logger("supervisor")


def raise_open_files() -> int:
    """Raise this process's soft open-files limit to its hard limit (systemd's default soft
    limit, 1,024, is what idle connections would otherwise exhaust) and log both; returns the
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.info("supervisor.open_files", limit=soft, hard=hard, raised_from=None)
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # a kernel cap below the hard limit (macOS)
        log.warning("supervisor.open_files", limit=soft, hard=hard, error=str(exc))
        return soft
    log.info("supervisor.open_files", limit=target, hard=hard, raised_from=soft)
    return target


class Supervisor:
    def __init__(self, config: Config, dsn: str, *, clock: Clock | None = None) -> None:
        self.config = config
        self.dsn = dsn
        self.clock = clock or Clock()
        self.metrics = Metrics()
        self.metrics.build_info.labels(
            promptsched.__version__, promptsched.commit(), str(migrate.latest_version())
        ).set(1)
        self.ready = False
        self.worker: WorkerPool | None = None
        self.api: api_app.ApiServer | None = None
        self.announcement: Path | None = None
        self.provider_kinds: dict[str, str] = {}
        self.provider_settings: dict[str, ProviderSettings] = {}
        self.progress = ProgressHub()
        self.open_files: int | None = None
        # Unique to this process's lifetime: its row in `replicas`, and the prefix of every
        # duty it holds in `leaders`, so `status` can say who leads what.
        self.worker_id = config.worker_id or default_worker_id()  # once: the default is random
        self.replica_id = f"{self.worker_id}/{secrets.token_hex(4)}"

    async def run(self) -> None:
        config = self.config
        if config.allow_private_webhooks:
            log.warning(
                "config.deprecated",
                setting="PROMPTSCHED_ALLOW_PRIVATE_WEBHOOKS",
                replacement="PROMPTSCHED_WEBHOOK_ALLOW",
                message="PROMPTSCHED_ALLOW_PRIVATE_WEBHOOKS is deprecated: it now lets webhooks "
                "reach loopback and private ranges only (not metadata, link-local, CGNAT or the "
                "agent tools); list what webhooks may reach in PROMPTSCHED_WEBHOOK_ALLOW instead",
                webhook_allow=str(config.webhook_allow),
            )
        self.open_files = raise_open_files()
        if "api" in config.roles:
            mcp_http.prepare()  # before any role holds a lease (the SDK takes a second to load)
        settings = parse_providers(config.env, config.providers_raw)
        self.provider_settings = settings
        self.provider_kinds = {name: provider.kind for name, provider in settings.items()}
        self.default_models = {name: p.default_model for name, p in settings.items()}
        # Every series of every label value this process can know exists at 0 from here on.
        self.metrics.know(config.prices.with_default_models(self.default_models).models(settings))
        self.tools = ToolRegistry.from_settings(
            allow=config.tools_allow,
            mcp=parse_mcp_servers(config.mcp_servers, config.mcp_raw),
        )
        # Before the pool: a webhook provider the allowlist refuses stops startup (ConfigError).
        registry, limiters = build_registry(
            settings, self.tools, webhook_allow=config.webhook_allow
        )
        # The floor keeps a connection each for the claim, the final writes and the two batches
        # of a rush open (and their types resolved) through idle hours, so the 9 o'clock rush
        # does not open them first.
        pool = await pools.create_pool(
            self.dsn,
            min_size=4,
            max_size=max(4, min(config.workers + 4, 40)),
            statement_cache_size=config.database.statement_cache_size,
        )
        try:
            # On a connection of its own, over the direct URL when the main one is a
            # transaction pooler: a step outside a transaction holds a session lock.
            conn = await pools.connect(self.config.database.direct_url or self.dsn)
            try:
                applied = await migrate.apply(conn)
                await migrate.check(conn)
            finally:
                await conn.close()
            if applied:
                log.info("migrations.applied", versions=applied)
            # Everything startup built so far lives as long as the process: no collection
            # walks it again, and the young generation holds more runs' objects (heap.py).
            frozen = heap.settle()
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async with anyio.create_task_group() as tg:
                    await self._start_roles(tg, pool, registry, limiters)
                    self.ready = True
                    log.info(
                        "supervisor.ready",
                        roles=list(config.roles),
                        workers=config.workers,
                        worker_id=self.worker_id,
                        heap_frozen=frozen,
                        event_loop=eventloop.running(),
                    )
                    async for signum in signals:
                        log.info("supervisor.stopping", signal=signal.Signals(signum).name)
                        break
                    await self._drain()
                    tg.cancel_scope.cancel()
        finally:
            announcement.withdraw(self.announcement)
            with anyio.CancelScope(shield=True):
                await registry.aclose()
                await self.tools.aclose()
                await pool.close()
                output_patterns.close()  # the output_schema pattern checker, if it started
            log.info("supervisor.stopped")

    async def _start_roles(
        self, tg: TaskGroup, pool: asyncpg.Pool[Any], registry: Any, limiters: Any
    ) -> None:
        config, roles = self.config, set(self.config.roles)
        handlers: dict[str, Callable[[str | None], None]] = {}
        await tg.start(LoopProbe(self.metrics).run)  # every process, whatever its roles
        await tg.start(self._presence(pool).run)  # published before any role starts work
        # The scheduler and the workers of one process share its cores: while the scheduler
        # writes a rush, the workers hold back to one slot (loop.Rush).
        rush = Rush()
        if "scheduler" in roles:
            scheduler = Scheduler(pool, self.clock, self.metrics, config.scheduler, rush=rush)
            handlers[listen.CHANNEL_SCHEDULES] = scheduler.notify
        if "worker" in roles and config.workers > 0:
            heartbeat = Heartbeat(
                pool, self.clock, self.metrics, lease=config.lease, interval=config.heartbeat
            )
            self.worker = WorkerPool(
                pool,
                self.clock,
                self.metrics,
                registry,
                limiters,
                heartbeat,
                replace(
                    config.worker,
                    worker_id=self.worker_id,
                    prices=config.prices.with_default_models(self.default_models),
                ),
                rush=rush,
            )
            rush.on_end(self.worker.wakeup.set)  # the rush is written: claim with every slot
            handlers[listen.CHANNEL_RUNS] = self.worker.notify
        notifier = self._notifier(pool) if "notifier" in roles else None
        if notifier is not None:
            handlers[listen.CHANNEL_OUTBOX] = notifier.notify
        if "api" in roles:
            handlers[listen.CHANNEL_PROGRESS] = self.progress.on_notify
        if roles & {"worker", "api"}:
            await tg.start(self.tools.run)  # MCP servers connected before runs or checks use them
        if handlers:
            await tg.start(self._listener(pool, handlers).run)
        if "scheduler" in roles:
            await tg.start(scheduler.run)
        if self.worker is not None:
            await tg.start(self.worker.run)
        if notifier is not None:
            await tg.start(notifier.run)
        if "reaper" in roles:
            reaping = config.reaper
            await tg.start(Reaper(pool, self.clock, self.metrics, reaping).run)
            if reaping.retention > timedelta(0):
                retention = Retention(pool, self.clock, self.metrics, retention=reaping.retention)
                await tg.start(retention.run)
        if "api" in roles:
            # Every replica serving /metrics competes for the stats duty; only the leader reads
            # the queue gauges from the database (roles/stats.py).
            stats = Stats(pool, self.clock, self.metrics, holder=self.replica_id, limiters=limiters)
            await tg.start(stats.run)
            serving = config.api
            app = api_app.build(
                pool,
                self.metrics,
                lambda: self.ready,
                clock=self.clock,
                providers=registry.names(),
                provider_kinds=self.provider_kinds,
                webhook_allow=serving.webhook_allow,
                tools=self.tools.catalog,
                progress=self.progress,
                retention=serving.retention,
                published=lambda: self.published().config,
                doctor=lambda: doctor.run(self.config, self.dsn, self.published()),
                # the operator console (pages under / outside /v1) and MCP at /mcp
                mounts=(console.mount, mcp_http.mount),
                edge=Edge(serving.trusted_proxies, serving.public_https),
                max_schedules=serving.max_schedules,
                rates=TokenRates(serving.rate, serving.burst),
            )
            limits = protocol.Limits(
                idle=serving.idle_timeout.total_seconds(),
                headers=serving.header_timeout.total_seconds(),
                body=serving.body_timeout.total_seconds(),
                max_connections=serving.max_connections,
            )
            self.api = api_app.ApiServer(
                app, serving.host, serving.port, limits=limits, open_files=self.open_files
            )
            await tg.start(self.api.run)
            # The address it really bound, for `promptsched healthcheck` (the image's check).
            self.announcement = announcement.announce(
                config.data_dir, serving.host, self.api.bound_port or serving.port
            )

    def published(self) -> fleet.Published:
        """This replica's configuration as the fleet sees it (ops/fleet.py)."""
        return fleet.describe(
            self.config,
            self.provider_settings,
            roles=self.config.roles,
            slots=self.config.workers if "worker" in self.config.roles else 0,
            catalog=self.tools.catalog() if set(self.config.roles) & {"worker", "api"} else None,
        )

    def _presence(self, pool: asyncpg.Pool[Any]) -> Presence:
        def describe() -> queries.ReplicaRow:
            published = self.published()
            return queries.ReplicaRow(
                id=self.replica_id, host=socket.gethostname(), version=fleet.VERSION,
                roles=self.config.roles, slots=published.config["slots"],
                config=published.config, fingerprint=published.fingerprint,
            )  # fmt: skip

        def in_flight() -> int:
            return len(self.worker.inflight) if self.worker is not None else 0

        return Presence(
            pool, self.clock, self.metrics, describe=describe, in_flight=in_flight,
            interval=self.config.fleet_interval,
        )  # fmt: skip

    def _listener(
        self, pool: asyncpg.Pool[Any], handlers: dict[str, Callable[[str | None], None]]
    ) -> listen.Listener:
        """LISTEN needs a session: the direct URL when the main one is a transaction pooler.
        Its self-check sends through the pool, the way every wake-up is sent."""
        checks, healthy = self.metrics.listener_checks, self.metrics.listener_healthy

        def on_check(ok: bool) -> None:
            checks.labels("ok" if ok else "lost").inc()
            healthy.set(1 if ok else 0)

        direct = self.config.database.direct_url or self.dsn
        return listen.Listener(direct, handlers, check_db=pool, on_check=on_check)

    def _notifier(self, pool: asyncpg.Pool[Any]) -> Notifier:
        config = self.config
        return Notifier(pool, self.clock, self.metrics, build_senders(config), config.notifier)

    async def _drain(self) -> None:
        """Phase one: not ready, stop claiming, give in-flight runs the grace, release the rest."""
        self.ready = False
        if self.worker is not None:
            log.info(
                "supervisor.draining",
                inflight=len(self.worker.inflight),
                grace=str(self.config.drain_grace),
            )
            await self.worker.drain(self.config.drain_grace)
