"""W9 slow calls at high concurrency: N = 10 x C chat completions that each take LATENCY seconds
(2 s) at a stand-in provider (bench/llm_server.py, a process of its own), C of them in flight:
C = 500, 2,000 and 5,000 through one ``promptsched run``, and 2,000 through each of two replicas
(one provider limit of 4,000 for both). Ideal wall time is N x LATENCY / C. Beside each, its
own bare baseline: the same calls from a plain aiohttp loop of C coroutines and no database,
the physical limit of this machine.

Per drain: wall time (from the NOTIFY that starts it to the last finish the database recorded)
and its ratio to the ideal and to the bare loop; CPU per run of the service processes and of
every Postgres process; WAL bytes per run; peak RSS and what each call in flight adds to it;
the event loop's lag during the drain (its p99 bucket, from the service's own probe); lease
renewals and final writes per run and a final write's mean time (the service's metrics); the
server's count of calls: every run called exactly once (``requests == N``, no key twice).

``BENCH_W9_CONCS`` (default ``500,2000,5000``), ``BENCH_W9_REPLICAS`` (``2x2000``; empty: none),
``BENCH_W9_LATENCY`` (2), ``BENCH_W9_PER_C`` (10). ``BENCH_W9_SCHEDULE`` sets columns of the
one schedule every run belongs to, as JSON: ``'{"notify_when": "changed"}'`` measures the same
drain for a monitor whose every success is compared with the one before it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench.common import Process, fresh_database
from promptsched.store.embedded import EmbeddedPostgres

LATENCY = float(os.environ.get("BENCH_W9_LATENCY", "2"))
PER_C = int(os.environ.get("BENCH_W9_PER_C", "10"))
CONCS = [int(c) for c in os.environ.get("BENCH_W9_CONCS", "500,2000,5000").split(",") if c]
REPLICAS = os.environ.get("BENCH_W9_REPLICAS", "2x2000")
CLK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cpu_of_tree(root: int) -> float:
    """CPU seconds of ``root`` and its descendants (reaped children included)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return total


def _rss_kb(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB
    except OSError:
        return 0


class Server:
    """The stand-in provider, in a process of its own."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.llm_server", "--port", str(self.port),
             "--latency", str(LATENCY)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.process.stdout.readline()  # "ready"

    async def call(self, path: str, method: str = "GET") -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.request(method, self.url + path) as response:
                answer: dict[str, Any] = json.loads(await response.read())
                return answer

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


async def _bare(server: Server, conc: int, n: int) -> dict[str, float]:
    """The same calls from C coroutines of a plain aiohttp loop, no database."""
    await server.call("/reset", "POST")
    connector = aiohttp.TCPConnector(limit=conc)
    timeout = aiohttp.ClientTimeout(total=120)
    url = server.url + "/v1/chat/completions"
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        todo = iter(range(n))

        async def caller() -> None:
            for i in todo:
                body = {"model": "m", "messages": [{"role": "user", "content": f"W9 job b{i}"}]}
                async with session.post(url, json=body) as response:
                    json.loads(await response.read())

        used = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(conc)))
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    stats = await server.call("/stats")
    assert stats["requests"] == n and stats["duplicates"] == 0, stats
    return {"wall_s": wall, "cpu_us_per_run": cpu / n * 1e6}


def _env(dsn: str, server: Server, slots: int, limit: int, port: int) -> dict[str, str]:
    return {
        "PROMPTSCHED_DATABASE_URL": dsn,
        "PROMPTSCHED_HTTP_PORT": str(port),
        "PROMPTSCHED_WORKERS": str(slots),
        "PROMPTSCHED_RETENTION": "0",
        "PROMPTSCHED_PROVIDERS": "llm",
        "PROMPTSCHED_PROVIDER_LLM_KIND": "openai",
        "PROMPTSCHED_PROVIDER_LLM_BASE_URL": server.url + "/v1",
        "PROMPTSCHED_PROVIDER_LLM_MODEL": "fake-model",
        "PROMPTSCHED_PROVIDER_LLM_MAX_CONCURRENCY": str(limit),  # fleet-wide
        "PROMPTSCHED_PROVIDER_LLM_TIMEOUT": "60s",
    }


async def _metrics(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = values.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return values


def _lag_p99(before: dict[str, float], after: dict[str, float]) -> float:
    """The upper bound (ms) of the bucket the loop-lag probe's 99th percentile falls in."""
    name = "promptsched_event_loop_lag_seconds"
    count = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
    buckets = sorted(
        (float(m.group(1)), value - before.get(key, 0.0))
        for key, value in after.items()
        if (m := re.fullmatch(name + r'_bucket\{le="([0-9.e+-]+)"\}', key))
    )
    for bound, seen in buckets:
        if count and seen >= 0.99 * count:
            return bound * 1000
    return float("inf")


async def _runs(conn: asyncpg.Connection[Any], n: int) -> None:
    await conn.execute(
        "INSERT INTO schedules (name, kind, expression, prompt, provider) "
        "VALUES ('w9', 'cron', '0 9 * * 1', 'W9 job {{ run_id }}', 'llm')"
    )
    await _schedule_options(conn, json.loads(os.environ.get("BENCH_W9_SCHEDULE") or "{}"))
    await conn.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT (SELECT min(id) FROM schedules), now() - g * interval '1 millisecond', "
        "'manual', 'llm', 3, now() - interval '1 hour' FROM generate_series(1, $1) g",
        n,
    )
    await conn.execute("ANALYZE")
    await conn.execute("CHECKPOINT")


async def _schedule_options(conn: asyncpg.Connection[Any], options: dict[str, Any]) -> None:
    """BENCH_W9_SCHEDULE: the schedule's columns, read from the JSON as the table types them."""
    known = {
        row["column_name"]
        for row in await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'schedules'"
        )
    }
    unknown = set(options) - known
    if unknown:
        raise SystemExit(f"BENCH_W9_SCHEDULE: no such schedules columns {sorted(unknown)}")
    if options:
        columns = ", ".join(f'"{name}"' for name in options)
        await conn.execute(
            f"UPDATE schedules s SET ({columns}) = "
            f"(SELECT {columns} FROM jsonb_populate_record(s, $1::text::jsonb))",
            json.dumps(options),
        )


async def _ready(port: int) -> None:
    for _ in range(600):
        try:
            await _metrics(port)
            return
        except (aiohttp.ClientError, OSError):
            await asyncio.sleep(0.1)
    raise TimeoutError("the service did not answer /metrics")


@dataclass
class Sample:
    """What the drain is measured by, taken before and after it."""

    cpu: float  # the services' process trees
    postgres: float  # every Postgres process
    rss_kb: int
    lsn: str
    metrics: list[dict[str, float]]  # each service's /metrics

    @classmethod
    async def take(
        cls, conn: asyncpg.Connection[Any], pids: list[int], postmaster: int, ports: list[int]
    ) -> Sample:
        return cls(
            sum(_cpu_of_tree(pid) for pid in pids),
            _cpu_of_tree(postmaster),
            sum(_rss_kb(pid) for pid in pids),
            await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text"),
            [await _metrics(port) for port in ports],
        )


async def _drain(
    embedded: EmbeddedPostgres, workdir: Path, server: Server, replicas: int, slots: int
) -> dict[str, float]:
    """N = PER_C x (replicas x slots) runs through ``replicas`` services of ``slots`` each."""
    conc = replicas * slots
    n = PER_C * conc
    dsn = await fresh_database(embedded)
    conn = await asyncpg.connect(dsn)
    ports = [_free_port() for _ in range(replicas)]
    services = [
        Process(dsn, workdir / f"w9-{conc}-{i}.log", _env(dsn, server, slots, conc, port))
        for i, port in enumerate(ports)
    ]
    try:
        for port in ports:
            await _ready(port)
        await _runs(conn, n)
        await server.call("/reset", "POST")
        pids = [s.process.pid for s in services]
        postmaster = int((embedded.pgdata / "postmaster.pid").read_text().split()[0])
        before = await Sample.take(conn, pids, postmaster, ports)
        peak = before.rss_kb
        started = time.time()
        await conn.execute("SELECT pg_notify('promptsched_runs', 'w9')")
        while await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE status IN ('pending', 'running'))"
        ):
            peak = max(peak, sum(_rss_kb(pid) for pid in pids))
            await asyncio.sleep(0.2)
        after = await Sample.take(conn, pids, postmaster, ports)
        last = await conn.fetchval("SELECT extract(epoch FROM max(finished_at)) FROM runs")
        wal = await conn.fetchval(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)", after.lsn, before.lsn
        )
        succeeded = await conn.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'")
        decided = await conn.fetchval(  # a monitor's decisions (BENCH_W9_SCHEDULE)
            "SELECT count(*) FROM runs WHERE notify_decision IS NOT NULL"
        )
        # Where the slots' time went: in attempts (the call, the answer's handling, the final
        # write until its commit), or idle between one attempt's end and the next one's start.
        busy = await conn.fetchval(
            "SELECT extract(epoch FROM sum(finished_at - attempt_started_at))::float8 FROM runs"
        )
        stats = await server.call("/stats")
    finally:
        for service in services:
            service.stop()
        await conn.close()
    figures = _figures(before, after, conc, n, float(last) - started, peak)
    figures.update({
        "attempt_s_mean": busy / n,
        "slot_idle_share": 1 - busy / (conc * (float(last) - started)),
        "wal_bytes_per_run": float(wal) / n,
        "calls": stats["requests"],
        "calls_doubled": stats["duplicates"],
        "calls_lost": n - stats["keys"],
        "succeeded": succeeded,
        "decided": decided,
    })  # fmt: skip
    return figures


def _figures(
    before: Sample, after: Sample, conc: int, n: int, wall: float, peak_kb: int
) -> dict[str, float]:
    delta: dict[str, float] = {}  # the services' metrics, summed over the drain
    for was, now in zip(before.metrics, after.metrics, strict=True):
        for key, value in now.items():
            delta[key] = delta.get(key, 0.0) + value - was.get(key, 0.0)
    writes = delta.get("promptsched_final_write_seconds_count", 0.0)
    gc = 'python_gc_collections_total{generation="%s"}'
    lags = zip(before.metrics, after.metrics, strict=True)
    return {
        "wall_s": wall,
        "ideal_s": n * LATENCY / conc,
        "ratio_of_ideal": n * LATENCY / conc / wall,
        "worker_cpu_us_per_run": (after.cpu - before.cpu) / n * 1e6,
        "postgres_cpu_us_per_run": (after.postgres - before.postgres) / n * 1e6,
        "rss_peak_mb": peak_kb / 1024,
        "rss_kb_per_call_in_flight": (peak_kb - before.rss_kb) / conc,
        "loop_lag_p99_ms": max(_lag_p99(was, now) for was, now in lags),
        "lease_renewals_per_run": delta.get("promptsched_leases_renewed_total", 0.0) / n,
        "final_writes_per_run": writes / n,
        "final_write_mean_ms": (
            delta.get("promptsched_final_write_seconds_sum", 0.0) / writes * 1000
            if writes
            else float("nan")
        ),
        "gc_collections": sum(delta.get(gc % g, 0.0) for g in range(3)),
    }


async def run(embedded: EmbeddedPostgres, workdir: Path) -> dict[str, float]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the services inherit it
    server = Server()
    results: dict[str, float] = {}
    try:
        shapes = [(1, conc) for conc in CONCS]
        if REPLICAS:
            count, slots = (int(part) for part in REPLICAS.split("x"))
            shapes.append((count, slots))
        for replicas, slots in shapes:
            conc = replicas * slots
            name = f"{replicas}x{slots}" if replicas > 1 else f"c{conc}"
            bare = await _bare(server, conc, PER_C * conc)
            drain = await _drain(embedded, workdir, server, replicas, slots)
            drain["ratio_of_bare"] = bare["wall_s"] / drain["wall_s"]
            drain["bare_ratio_of_ideal"] = drain["ideal_s"] / bare["wall_s"]
            drain["bare_cpu_us_per_run"] = bare["cpu_us_per_run"]
            results.update({f"{name}_{key}": value for key, value in drain.items()})
            print(f"w9 {name}: {json.dumps(drain)}", flush=True)
    finally:
        server.stop()
    return results
