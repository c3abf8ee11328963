"""Shared bench harness: an embedded Postgres of its own, fresh databases, service processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg

from promptsched.store import migrate
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres


def fsync_on() -> bool:
    value = os.environ.get("BENCH_FSYNC", "on").lower()
    if value not in ("on", "off"):
        raise SystemExit(f"BENCH_FSYNC must be on or off, got {value!r}")
    return value == "on"


@contextmanager
def server() -> Iterator[EmbeddedPostgres]:
    data_dir = Path(tempfile.mkdtemp(prefix="psb-", dir="/tmp"))
    # fsync and synchronous_commit on, as deployments run (BENCH_FSYNC=off for the second
    # column: the same figures without the commit's flush, for both promptsched and the
    # bare-SQL baselines, so ratios stay fair either way).
    embedded = EmbeddedPostgres(data_dir, fast_unsafe=not fsync_on())
    embedded.ensure_running()
    try:
        yield embedded
    finally:
        embedded.stop("immediate")
        shutil.rmtree(data_dir, ignore_errors=True)


async def fresh_database(embedded: EmbeddedPostgres) -> str:
    name = f"b_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(embedded.dsn())
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    dsn = embedded.dsn(name)
    conn = await pools.connect(dsn)
    try:
        await migrate.apply(conn)
    finally:
        await conn.close()
    return dsn


class Process:
    """A `promptsched run` process for a workload."""

    def __init__(self, dsn: str, log: Path, env: dict[str, str] | None = None) -> None:
        full = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
        full.update(
            {
                "PROMPTSCHED_DATABASE_URL": dsn,
                "PROMPTSCHED_HTTP_PORT": "0",
                "PROMPTSCHED_LOG_FORMAT": "json",
                "PROMPTSCHED_LOG_LEVEL": "warning",
            }
        )
        full.update(env or {})
        self.log = log
        self._handle = open(log, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "promptsched", "run"],
            env=full,
            stdout=self._handle,
            stderr=subprocess.STDOUT,
        )

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._handle.close()


async def wait_for(
    predicate: Callable[[], Awaitable[Any]], timeout: float, interval: float = 0.02
) -> float:
    """Seconds until ``predicate`` is truthy; raises after ``timeout``."""
    start = time.perf_counter()
    while not await predicate():
        if time.perf_counter() - start > timeout:
            raise TimeoutError("bench condition not reached")
        await asyncio.sleep(interval)
    return time.perf_counter() - start


async def wait_drained(
    conn: asyncpg.Connection[Any], timeout: float, interval: float = 0.02
) -> float:
    """Seconds until no run is pending or running; raises after ``timeout``."""

    async def drained() -> bool:
        return not await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE status IN ('pending', 'running'))"
        )

    return await wait_for(drained, timeout, interval=interval)


def spread(name: str, values: Sequence[float]) -> dict[str, float]:
    """``name``'s 50th and 99th percentiles and maximum, as ``<name>_p50/_p99/_max``."""
    return {
        f"{name}_p50": percentile(values, 50),
        f"{name}_p99": percentile(values, 99),
        f"{name}_max": max(values, default=float("nan")),
    }


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
