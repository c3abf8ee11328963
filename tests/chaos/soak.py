"""The chaos scenario: replicas of ``promptsched run`` share one Postgres behind a TCP proxy,
hundreds of second-level schedules run a slow, flaky echo provider and notify a webhook sink,
while the injector breaks things; then the faults stop, the cadence window closes, every
owed run and notification is waited for, and the checker proves the invariants."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from promptsched import netguard
from promptsched.clock import Clock
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from promptsched.store import migrate
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres
from tests.chaos import checker
from tests.chaos.fleet import Fleet
from tests.chaos.injector import Injector, say
from tests.chaos.proxy import TcpProxy
from tests.fakes.http_sink import HttpSink, Reply, start_http_sink

LOOPBACK = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)

DATABASE = "chaos"
# Second-level crons (seconds first): a spread of periods, ~0.19 runs/s per schedule.
PERIODS = (2, 3, 4, 5, 6, 10, 15, 20, 30)
SCRAPED = (
    "promptsched_fenced_writes_total",
    "promptsched_leases_lost_total",
    "promptsched_leases_reaped_total",
    "promptsched_role_errors_total",
    "promptsched_retries_total",
)


@dataclass(frozen=True)
class ChaosConfig:
    seconds: float = 150.0
    schedules: int = 200
    processes: int = 3
    workers: int = 8
    seed: int = 0
    lease: float = 3.0
    gap: tuple[float, float] = (1.5, 4.5)  # seconds between faults
    sink_fail_rate: float = 0.1
    settle_timeout: float = 120.0
    keep: Path | None = None  # keep logs and the data directory here

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **defaults: Any) -> ChaosConfig:
        env = os.environ if env is None else env
        base = cls(**defaults)
        seed = env.get("CHAOS_SEED")
        keep = env.get("CHAOS_KEEP")
        return cls(
            seconds=float(env.get("CHAOS_SECONDS", base.seconds)),
            schedules=int(env.get("CHAOS_SCHEDULES", base.schedules)),
            processes=int(env.get("CHAOS_PROCESSES", base.processes)),
            workers=int(env.get("CHAOS_WORKERS", base.workers)),
            seed=int(seed) if seed else random.SystemRandom().randrange(1, 2**31),
            lease=base.lease,
            gap=base.gap,
            sink_fail_rate=base.sink_fail_rate,
            settle_timeout=base.settle_timeout,
            keep=Path(keep) if keep else base.keep,
        )


@dataclass
class Report:
    config: ChaosConfig
    faults: Counter[str]
    hits: Counter[str]
    invariants: list[checker.Invariant]
    numbers: dict[str, Any] = field(default_factory=dict)
    workdir: Path | None = None

    @property
    def ok(self) -> bool:
        return all(inv.held for inv in self.invariants)

    def render(self) -> str:
        c = self.config
        lines = [
            f"chaos: seed={c.seed} seconds={c.seconds:g} schedules={c.schedules} "
            f"processes={c.processes} workers={c.workers} lease={c.lease:g}s",
            "",
            "faults injected:",
        ]
        lines += [f"  {kind:<32} {count}" for kind, count in sorted(self.faults.items())]
        lines += [f"  {'total':<32} {sum(self.faults.values())}", "", "fault effects:"]
        lines += [f"  {what:<32} {count}" for what, count in sorted(self.hits.items())]
        lines += ["", "observed:"]
        lines += [f"  {name:<32} {value}" for name, value in self.numbers.items()]
        lines += ["", checker.table(self.invariants), ""]
        lines.append("ALL INVARIANTS HELD" if self.ok else "INVARIANTS VIOLATED")
        if self.workdir is not None:
            lines.append(f"logs and data: {self.workdir}")
        return "\n".join(lines)


def process_env(config: ChaosConfig) -> dict[str, str]:
    return {
        "PROMPTSCHED_WORKERS": str(config.workers),
        "PROMPTSCHED_LEASE": f"{config.lease:g}s",
        "PROMPTSCHED_HEARTBEAT": f"{config.lease / 3:g}s",
        "PROMPTSCHED_DRAIN_GRACE": "1s",
        "PROMPTSCHED_RETRY_BASE": "100ms",
        "PROMPTSCHED_RETRY_MAX": "1s",
        "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32",
        "PROMPTSCHED_NOTIFIER_RETRY_BASE": "200ms",
        "PROMPTSCHED_NOTIFIER_RETRY_MAX": "2s",
        "PROMPTSCHED_NOTIFIER_LEASE": "10s",
        "PROMPTSCHED_NOTIFIER_TIMEOUT": "5s",
        "PROMPTSCHED_SCHEDULER_MAX_SLEEP": "1s",
        "PROMPTSCHED_REAPER_MAX_SLEEP": "1s",
    }


def schedule_input(rng: random.Random, index: int, hook: str) -> dict[str, Any]:
    """One schedule: a second-level cron, a slow and flaky echo, a policy mix, a webhook."""
    period = rng.choice(PERIODS)
    # Slow, but mostly done before the next slot, so most slots run rather than overlap.
    latency = rng.choice([ms for ms in (0, 100, 300, 800, 1500) if ms <= period * 333])
    timeout = "3s"
    overlap = rng.choice(("skip", "skip", "allow", "buffer_one", "buffer_all", "cancel_other"))
    if overlap.startswith("buffer") and period < 10:
        overlap = "buffer_one"  # buffer_all of a slow, flaky, fast schedule only grows a backlog
    if rng.random() < 0.05:  # a few hang past their timeout on every attempt
        latency, timeout, overlap = 5000, "2s", "skip"
    return {
        "name": f"chaos-{index}",
        "cron": f"*/{period} * * * * *",
        "prompt": f"chaos {index} at {{{{ slot }}}}",
        "params": {"latency": f"{latency}ms", "fail_rate": round(rng.uniform(0.0, 0.35), 2)},
        "max_attempts": rng.choice((1, 2, 3, 3, 4)),
        "timeout": timeout,
        "misfire": rng.choice(("run_once", "run_once", "skip", "run_all")),
        "misfire_grace": rng.choice(("1s", "2s", "60s")),
        "overlap": overlap,
        "notify": {"webhook": {"url": hook}, "on_success": True, "on_failure": True},
    }


async def create_schedules(
    pool: asyncpg.Pool[Any], rng: random.Random, count: int, hook: str
) -> dict[int, datetime]:
    """The schedules, through the service's own validation; returns each first slot."""
    first: dict[int, datetime] = {}
    for index in range(count):
        values = inputs.validate(
            schedule_input(rng, index, hook), providers=["echo"], webhook_allow=LOOPBACK
        )
        row = await schedule_ops.create_schedule(pool, Clock(), values, owner="chaos")
        assert row.next_fire_at is not None
        first[row.id] = row.next_fire_at
    return first


async def close_window(pool: asyncpg.Pool[Any], ids: list[int]) -> dict[int, datetime | None]:
    """End the cadence: take each cursor away (under the row lock a ticking scheduler holds,
    so no tick is half-counted) and return where it stood. Slots before it are the window."""
    rows = await pool.fetch(
        "WITH old AS (SELECT id, next_fire_at FROM schedules WHERE id = ANY($1) FOR UPDATE) "
        "UPDATE schedules s SET next_fire_at = NULL FROM old WHERE s.id = old.id "
        "RETURNING s.id, old.next_fire_at",
        ids,
    )
    return {row["id"]: row["next_fire_at"] for row in rows}


async def settle(pool: asyncpg.Pool[Any], ids: list[int], timeout: float) -> float | None:
    """Seconds until no run is pending or running and the outbox is drained; None if never."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        left = await pool.fetchval(
            "SELECT (SELECT count(*) FROM runs WHERE schedule_id = ANY($1) "
            "        AND status IN ('pending', 'running')) "
            "     + (SELECT count(*) FROM outbox WHERE schedule_id = ANY($1) "
            "        AND status IN ('pending', 'sending'))",
            ids,
        )
        if not left:
            return time.monotonic() - started
        await anyio.sleep(0.25)
    return None


async def scrape(fleet: Fleet) -> Counter[str]:
    """The counters of the live processes (an incarnation's counters die with it)."""
    totals: Counter[str] = Counter()
    async with aiohttp.ClientSession() as session:
        for member in fleet.members:
            listening = member.has_event("api.listening")
            if listening is None:
                continue
            url = f"http://127.0.0.1:{listening['port']}/metrics"
            async with session.get(url) as response:
                text = await response.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in SCRAPED:
                        totals[sample.name] += int(sample.value)
    return totals


def _sink_responder(rng: random.Random, fail_rate: float) -> Any:
    def reply() -> Reply:
        return Reply(503, body="chaos: try again") if rng.random() < fail_rate else Reply()

    return reply


async def prepare_database(postgres: EmbeddedPostgres) -> None:
    await anyio.to_thread.run_sync(postgres.ensure_running)
    admin = await asyncpg.connect(postgres.dsn())
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await admin.close()
    conn = await pools.connect(postgres.dsn(DATABASE))
    try:
        await migrate.apply(conn)
    finally:
        await conn.close()


async def run(config: ChaosConfig) -> Report:
    workdir = config.keep or Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"seed {config.seed}; logs and data in {workdir}")
    postgres = EmbeddedPostgres(workdir / "pg")  # durable settings: it will be crashed
    try:
        report = await _run(config, workdir, postgres)
    finally:
        await anyio.to_thread.run_sync(postgres.stop, "immediate")
    if report.ok and config.keep is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        report.workdir = workdir
    return report


async def _run(config: ChaosConfig, workdir: Path, postgres: EmbeddedPostgres) -> Report:
    rng = random.Random(config.seed)
    await prepare_database(postgres)
    proxy = await TcpProxy(str(postgres.socket_dir / ".s.PGSQL.5432")).start()
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    fleet = Fleet(proxy.dsn(DATABASE), logs, config.processes, process_env(config))
    admin_dsn = postgres.dsn(DATABASE)
    try:
        async with start_http_sink() as sink:
            sink.responder = _sink_responder(random.Random(rng.random()), config.sink_fail_rate)
            return await _scenario(config, rng, postgres, proxy, fleet, sink, admin_dsn)
    finally:
        fleet.terminate_all()
        await proxy.close()


async def _scenario(
    config: ChaosConfig,
    rng: random.Random,
    postgres: EmbeddedPostgres,
    proxy: TcpProxy,
    fleet: Fleet,
    sink: HttpSink,
    admin_dsn: str,
) -> Report:
    await fleet.start()
    say(f"{config.processes} processes ready")
    pool = await pools.create_pool(admin_dsn, min_size=0, max_size=4)
    try:
        first = await create_schedules(pool, rng, config.schedules, sink.url)
        ids = sorted(first)
        say(f"{len(ids)} schedules created; injecting faults for {config.seconds:g}s")
        injector = Injector(fleet, postgres, proxy, admin_dsn, rng, config.lease, config.gap)
        try:
            faults = await injector.run(config.seconds)
        except BaseException:
            say(f"the injector failed after {dict(injector.counts)}")
            raise
        say(f"faults stopped: {dict(faults)}; closing the window")
        ends = await close_window(pool, ids)
        settled_in = await settle(pool, ids, config.settle_timeout)
        say("settled" if settled_in is not None else "did NOT settle")
        await fleet.revive_crashed()
        metrics = await scrape(fleet)
        await fleet.stop_all()
        async with pool.acquire() as conn:
            evidence = await checker.Evidence.collect(
                conn,
                ids,
                windows={sid: (first[sid], ends.get(sid)) for sid in ids},
                deliveries=list(sink.requests),
                logs=checker.Logs.scan(fleet.log_paths),
                crashes=[
                    f"member {c.member} pid {c.pid} exited {c.code}: ...{c.tail[-600:]}"
                    for c in fleet.crashes
                ],
                exit_codes=fleet.exit_codes,
                settled_in=settled_in,
                db_crashes=injector.crashes,
            )
    finally:
        await pool.close()
    invariants = checker.check(evidence)
    numbers = _numbers(evidence, metrics, proxy, fleet)
    return Report(config, faults, injector.details, invariants, numbers)


def _numbers(
    ev: checker.Evidence, metrics: Counter[str], proxy: TcpProxy, fleet: Fleet
) -> dict[str, Any]:
    statuses = Counter(run["status"] for run in ev.runs)
    return {
        "runs": len(ev.runs),
        "runs by status": dict(sorted(statuses.items())),
        "attempts": len(ev.attempts),
        "webhook requests": len(ev.deliveries),
        "fenced (log events)": len(ev.logs.fenced),
        "fenced (live metrics)": metrics["promptsched_fenced_writes_total"],
        "runs reaped": ev.logs.events["run.reaped"],
        "role errors (log)": sum(ev.logs.events[name] for name in checker.RETRY_EVENTS),
        "role recoveries": ev.logs.events["role.recovered"],
        "proxy connections": f"{proxy.accepted} accepted, {proxy.refused} refused",
        "process incarnations": len(fleet.log_paths),
    }
