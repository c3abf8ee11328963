"""The fault injector: at random (seeded, bounded) moments it SIGKILLs and restarts a process,
SIGSTOPs one past its lease, SIGTERMs one, restarts Postgres, cuts every database connection,
or stalls them all past the lease. Faults come one at a time; the first round tries every
kind once."""

from __future__ import annotations

import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import asyncpg

from promptsched.store.embedded import EmbeddedPostgres
from tests.chaos.fleet import Fleet
from tests.chaos.proxy import TcpProxy

KINDS = (
    "sigkill_restart",
    "sigstop_past_lease",
    "postgres_restart",
    "connection_cut",
    "database_stall",
    "sigterm_restart",
)


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Injector:
    fleet: Fleet
    postgres: EmbeddedPostgres
    proxy: TcpProxy
    admin_dsn: str  # direct to Postgres, never through the proxy
    rng: random.Random
    lease: float
    gap: tuple[float, float] = (2.0, 6.0)
    counts: Counter[str] = field(default_factory=Counter)  # faults by kind
    details: Counter[str] = field(default_factory=Counter)  # what they hit
    notes: list[str] = field(default_factory=list)
    # When Postgres was stopped `immediate` (a crash: commits not yet flushed are lost)
    crashes: list[datetime] = field(default_factory=list)
    log: Callable[[str], None] = say

    async def run(self, seconds: float) -> Counter[str]:
        """Inject faults for ``seconds`` (longer if needed to try every kind once); every
        member is up and Postgres running on return."""
        deadline = time.monotonic() + seconds
        pending = list(KINDS)
        self.rng.shuffle(pending)
        while True:
            await self._pause(self.rng.uniform(*self.gap))
            if time.monotonic() >= deadline and not pending:
                break
            kind = pending.pop() if pending else self.rng.choice(KINDS)
            await getattr(self, kind)()
            self.counts[kind] += 1
        await self._revive()
        return self.counts

    async def _pause(self, seconds: float) -> None:
        """Wait, restarting any process that died on its own meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await self._revive()
            await anyio.sleep(min(0.25, max(0.0, end - time.monotonic())))

    async def _revive(self) -> None:
        for crash in await self.fleet.revive_crashed():
            self.details["unexpected exits"] += 1
            self.log(f"!! member {crash.member} (pid {crash.pid}) exited by itself ({crash.code})")

    async def _busy_member(self) -> int:
        """A member that holds a running run, if any (so a fault hits work in flight)."""
        try:
            conn = await asyncpg.connect(self.admin_dsn)
            try:
                workers = await conn.fetch(
                    "SELECT DISTINCT worker_id FROM runs WHERE status = 'running'"
                )
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError):
            workers = []
        busy = [self.fleet.index_of_worker(row["worker_id"] or "") for row in workers]
        candidates = sorted({i for i in busy if i is not None})
        return self.rng.choice(candidates or list(range(self.fleet.size)))

    async def sigkill_restart(self) -> None:
        index = await self._busy_member()
        pid = self.fleet.pid_of(index)
        self.details["processes killed"] += 1
        await self.fleet.kill(index, signal.SIGKILL)
        down = self.rng.uniform(0.0, 1.5)
        await anyio.sleep(down)
        await self.fleet.restart(index)
        self.log(f"SIGKILL member {index} (pid {pid}), restarted after {down:.1f}s")

    async def sigterm_restart(self) -> None:
        index = await self._busy_member()
        pid = self.fleet.pid_of(index)
        code = await self.fleet.kill(index, signal.SIGTERM)
        if code != 0:
            self.details["unclean SIGTERM exits"] += 1
            self.notes.append(f"SIGTERM of pid {pid} exited {code}")
        await self.fleet.restart(index)
        self.log(f"SIGTERM member {index} (pid {pid}) exited {code}, restarted")

    async def sigstop_past_lease(self) -> None:
        index = await self._busy_member()
        self.details["processes frozen past the lease"] += 1
        frozen = self.lease + self.rng.uniform(0.5, 2.0)
        self.fleet.freeze(index)
        try:
            await anyio.sleep(frozen)
        finally:
            self.fleet.thaw(index)
        self.log(f"SIGSTOP member {index} for {frozen:.1f}s (lease {self.lease:g}s), resumed")

    async def postgres_restart(self) -> None:
        mode = self.rng.choice(("fast", "immediate"))
        down = self.rng.uniform(0.5, 3.0)
        if mode == "immediate":
            self.crashes.append(datetime.now(UTC))
        await anyio.to_thread.run_sync(self.postgres.stop, mode)
        try:
            await anyio.sleep(down)
        finally:
            await anyio.to_thread.run_sync(self.postgres.ensure_running)
        self.details[f"postgres stopped {mode}"] += 1
        self.log(f"Postgres stopped ({mode}) for {down:.1f}s, started again")

    async def connection_cut(self) -> None:
        cut = self.proxy.cut_all()
        self.details["connections cut"] += cut
        self.log(f"cut {cut} database connections")

    async def database_stall(self) -> None:
        stalled = self.lease + self.rng.uniform(0.5, 2.0)
        self.proxy.stall()
        try:
            await anyio.sleep(stalled)
        finally:
            self.proxy.resume()
        self.details["database stalls past the lease"] += 1
        self.log(f"stalled every database connection for {stalled:.1f}s, resumed")
