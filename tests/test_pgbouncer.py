"""Behind PgBouncer in transaction mode (Debian's 1.18, no prepared-statement support): the
statement cache off, LISTEN on the direct URL, leadership as a row, and the listener's
self-check when LISTEN goes through the pooler by mistake."""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import anyio
import asyncpg
import pytest
from structlog.testing import capture_logs

from promptsched import cli
from promptsched import config as configuration
from promptsched.clock import Clock
from promptsched.errors import ConfigError
from promptsched.metrics import Metrics
from promptsched.roles.stats import Stats
from promptsched.store import listen, queries
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres
from tests import factories
from tests.factories import runs_settled
from tests.helpers import Service, assert_every_second_once, wait_until
from tests.pgbouncer_support import PgBouncer

# The replicas' poll interval when no wake-up arrives (worker/scheduler max sleep).
POLL_SECONDS = 5.0


@pytest.fixture(scope="module")
def bouncer(pg_server: EmbeddedPostgres) -> Iterator[PgBouncer]:
    running = PgBouncer(pg_server, pool_mode="transaction")
    yield running
    running.stop()


def _database(dsn: str) -> str:
    return urlparse(dsn).path.lstrip("/")


@pytest.fixture
async def pooled(bouncer: PgBouncer, dsn: str) -> AsyncIterator[asyncpg.Pool[Any]]:
    """A pool through PgBouncer, as the service builds it with the statement cache off."""
    created = await pools.create_pool(
        bouncer.dsn(_database(dsn)), min_size=4, max_size=8, statement_cache_size=0
    )
    yield created
    await created.close()


# --- the two settings -----------------------------------------------------------------------


def test_the_pooler_settings_come_from_env_flags_and_toml(tmp_path: Path) -> None:
    main, direct = "postgresql://u@pgbouncer:6432/db", "postgresql://u@postgres:5432/db"
    env = {"PROMPTSCHED_DATABASE_URL": main}
    assert configuration.load(env).direct_database_url is None  # the listener uses the main URL
    assert configuration.load(env).statement_cache_size == 100
    from_env = configuration.load(
        {
            **env,
            "PROMPTSCHED_DIRECT_DATABASE_URL": direct,
            "PROMPTSCHED_STATEMENT_CACHE_SIZE": "0",
        }
    )
    assert (from_env.direct_database_url, from_env.statement_cache_size) == (direct, 0)
    toml = tmp_path / "promptsched.toml"
    toml.write_text(f'direct_database_url = "{direct}"\nstatement_cache_size = 0\n')
    from_file = configuration.load({**env, "PROMPTSCHED_CONFIG": str(toml)})
    assert (from_file.direct_database_url, from_file.statement_cache_size) == (direct, 0)
    args = cli.build_parser().parse_args(
        ["run", "--direct-database-url", direct, "--statement-cache-size", "0"]
    )
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")}
    from_flags = configuration.load(env, overrides)
    assert (from_flags.direct_database_url, from_flags.statement_cache_size) == (direct, 0)


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"PROMPTSCHED_STATEMENT_CACHE_SIZE": "-1"}, "PROMPTSCHED_STATEMENT_CACHE_SIZE"),
        ({"PROMPTSCHED_STATEMENT_CACHE_SIZE": "off"}, "PROMPTSCHED_STATEMENT_CACHE_SIZE"),
        (
            {"PROMPTSCHED_DIRECT_DATABASE_URL": "postgresql://x/db"},
            "PROMPTSCHED_DIRECT_DATABASE_URL",
        ),
    ],
)
def test_bad_pooler_settings_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        configuration.load(env)
    assert raised.value.field == field


# --- statements and leadership through the pooler ------------------------------------------


async def test_named_statements_collide_and_the_cache_off_does_not(
    pg_server: EmbeddedPostgres, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One server connection, so two clients share it, as they do under load.
    single = PgBouncer(pg_server, pool_mode="transaction", pool_size=1)
    target = single.dsn(_database(dsn))
    try:
        first, second = await asyncpg.connect(target), await asyncpg.connect(target)
        try:
            monkeypatch.setattr(asyncpg.connection, "_uid", 0)
            assert await first.fetchval("SELECT 1") == 1
            # Statement names count per process: another replica's first is this one's first.
            monkeypatch.setattr(asyncpg.connection, "_uid", 0)
            with pytest.raises(asyncpg.DuplicatePreparedStatementError, match="already exists"):
                await second.fetchval("SELECT 1")
        finally:
            first.terminate()
            second.terminate()
        pool = await pools.create_pool(target, min_size=4, max_size=4, statement_cache_size=0)
        try:

            async def query(n: int) -> list[int]:
                # array types: resolved by the pool's probe, not looked up again here
                value: list[int] = await pool.fetchval("SELECT $1::bigint[]", [n, n + 1])
                return value

            results: list[list[int]] = []

            async def collect(n: int) -> None:
                results.append(await query(n))

            async with anyio.create_task_group() as tg:
                for n in range(40):
                    tg.start_soon(collect, n)
            assert sorted(results) == [[n, n + 1] for n in range(40)]
            # No session setting left behind on the server connection: asyncpg's type lookup
            # turns jit off and on again, inside the probe's transaction.
            assert await pool.fetchval("SELECT current_setting('jit')") == "on"
        finally:
            await pool.close()
    finally:
        single.stop()


async def test_stats_leadership_through_the_pooler_elects_one_and_hands_over(
    pooled: asyncpg.Pool[Any],
) -> None:
    replicas = [Stats(pooled, Clock(), Metrics()) for _ in range(4)]
    try:
        won = list(await asyncio.gather(*(replica.run_once() for replica in replicas)))
        assert won.count(True) == 1
        leader = replicas[won.index(True)]
        # Renewals keep the same term; the others keep losing.
        for _ in range(3):
            assert [await replica.run_once() for replica in replicas] == won
        await leader.close()
        rest = [replica for replica in replicas if replica is not leader]
        assert [await replica.run_once() for replica in rest].count(True) == 1
    finally:
        for replica in replicas:
            await replica.close()


# --- the listener's self-check --------------------------------------------------------------


async def _listen(
    listener: listen.Listener, body: Any, *, timeout: float = 20
) -> list[dict[str, Any]]:
    with capture_logs() as logs, anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            await tg.start(listener.run)
            await body()
            tg.cancel_scope.cancel()
    return logs


async def test_listen_through_the_pooler_is_caught_by_the_self_check(
    bouncer: PgBouncer, dsn: str, pooled: asyncpg.Pool[Any]
) -> None:
    heard: list[str | None] = []
    results: list[bool] = []
    listener = listen.Listener(
        bouncer.dsn(_database(dsn)),
        {listen.CHANNEL_RUNS: heard.append},
        check_db=pooled,
        on_check=results.append,
        check_timeout=1.0,
    )

    async def body() -> None:
        assert listener.wakeups_ok is False  # known before "started"
        assert listener.healthy is False

    logs = await _listen(listener, body)
    assert results == [False]
    failed = [e for e in logs if e["event"] == "listen.check_failed"]
    assert failed and failed[0]["log_level"] == "error"
    assert "PROMPTSCHED_DIRECT_DATABASE_URL" in failed[0]["hint"]


async def test_listen_on_the_direct_url_hears_what_the_pooler_sends(
    dsn: str, pooled: asyncpg.Pool[Any]
) -> None:
    heard: list[str | None] = []
    results: list[bool] = []
    listener = listen.Listener(
        dsn,
        {listen.CHANNEL_RUNS: heard.append},
        check_db=pooled,
        on_check=results.append,
        check_interval=0.2,
    )

    async def body() -> None:
        assert listener.wakeups_ok is True and listener.healthy
        await queries.run_notify_ready(pooled, "through the pooler")
        await wait_until(
            _holds(lambda: "through the pooler" in heard), timeout=5, what="the wake-up"
        )
        # and the check repeats
        await wait_until(_holds(lambda: len(results) >= 3), timeout=10, what="periodic checks")

    logs = await _listen(listener, body)
    assert results and all(results)
    assert not [e for e in logs if e["event"] == "listen.check_failed"]


def _holds(predicate: Any) -> Any:
    async def check() -> bool:
        return bool(predicate())

    return check


# --- two real replicas behind the pooler ---------------------------------------------------


async def _scrape(service: Service) -> str | None:
    event = service.has_event("api.listening")
    if event is None or service.process.poll() is not None:
        return None
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{event['port']}/metrics") as response:
                return await response.text()
    except aiohttp.ClientError:
        return None  # killed meanwhile


def _gauge(text: str | None, name: str) -> float:
    for line in (text or "").splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _readyz(service: Service) -> tuple[int, dict[str, Any]]:
    port = service.has_event("api.listening")["port"]  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
            return response.status, await response.json()


async def _start_latencies(
    pool: asyncpg.Pool[Any], schedule_id: int, before: Any = None
) -> list[float]:
    rows = await pool.fetch(
        "SELECT extract(epoch FROM a.started_at - r.slot)::float8 AS lag FROM runs r "
        "JOIN run_attempts a ON a.run_id = r.id AND a.number = 1 "
        "WHERE r.schedule_id = $1 AND ($2::timestamptz IS NULL OR r.slot < $2) ORDER BY r.slot",
        schedule_id,
        before,
    )
    return [row["lag"] for row in rows]


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def _service_env(bouncer: PgBouncer, dsn: str, *, direct: bool) -> dict[str, str]:
    env = {
        "PROMPTSCHED_DATABASE_URL": bouncer.dsn(_database(dsn)),
        "PROMPTSCHED_STATEMENT_CACHE_SIZE": "0",
        "PROMPTSCHED_WORKERS": "4",
    }
    if direct:
        env["PROMPTSCHED_DIRECT_DATABASE_URL"] = dsn
    return env


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_two_replicas_behind_the_pooler_wake_lead_once_and_keep_every_slot(
    bouncer: PgBouncer,
    dsn: str,
    pool: asyncpg.Pool[Any],
    pooled: asyncpg.Pool[Any],
    tmp_path: Path,
) -> None:
    env = _service_env(bouncer, dsn, direct=True)
    services = [Service(dsn, tmp_path / f"r{i}.log", env=env) for i in range(2)]
    samples: list[tuple[float, ...]] = []
    stop_sampling = anyio.Event()

    async def sample_leadership() -> None:
        while not stop_sampling.is_set():
            texts = [await _scrape(service) for service in services]
            leading = tuple(_gauge(text, "promptsched_stats_leader") for text in texts)
            samples.append(leading)
            assert sum(leading) <= 1, f"two leaders at once: {leading}"
            with anyio.move_on_after(0.1):
                await stop_sampling.wait()

    try:
        for service in services:
            await service.ready()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample_leadership)
            sid = await factories.ticking_schedule(pool, overlap="allow", announce=False)
            # As the API does after a save, through the pooler: the schedulers wake up for it.
            await queries.schedule_notify_changed(pooled, sid)

            async def succeeded(count: int) -> bool:
                done = await pool.fetchval(
                    "SELECT count(*) FROM runs WHERE schedule_id = $1 AND status = 'succeeded'",
                    sid,
                )
                return bool(done >= count)

            await wait_until(lambda: succeeded(15), timeout=40, what="fifteen runs")

            async def the_leader() -> Service | None:
                for service in services:
                    if _gauge(await _scrape(service), "promptsched_stats_leader") == 1:
                        return service
                return None

            leader = await wait_until(the_leader, timeout=15, what="a stats leader")
            survivor = services[1] if leader is services[0] else services[0]
            kill_slot = await pool.fetchval("SELECT now()")
            leader.signal(signal.SIGKILL)
            killed_at = time.monotonic()

            async def survivor_leads() -> bool:
                return _gauge(await _scrape(survivor), "promptsched_stats_leader") == 1

            await wait_until(survivor_leads, timeout=40, what="the survivor to take over")
            takeover = time.monotonic() - killed_at
            holder = await pool.fetchval("SELECT holder FROM leaders WHERE name = 'stats'")
            await wait_until(lambda: succeeded(14), timeout=30, what="runs after the kill")
            await pool.execute("UPDATE schedules SET next_fire_at = NULL WHERE id = $1", sid)

            await wait_until(lambda: runs_settled(pool), timeout=30, what="all runs finished")
            stop_sampling.set()
    finally:
        for service in services:
            service.stop()
    # Leadership: never two (asserted at every sample), one before and one after the kill.
    assert f":{survivor.pid}/" in holder
    assert takeover < 15 + 5 + 5, takeover  # term + renewal interval + scrape/start slack
    assert any(sum(s) == 1 for s in samples) and len(samples) > 20
    # No slot doubled or lost, across the kill.
    rows = await pool.fetch(
        "SELECT slot, status FROM runs WHERE schedule_id = $1 ORDER BY slot", sid
    )
    assert_every_second_once([row["slot"] for row in rows])
    assert {row["status"] for row in rows} == {"succeeded"}
    # Wake-ups, not polls: while both replicas ran, runs started well under the poll interval.
    steady = await _start_latencies(pool, sid, kill_slot)
    every = await _start_latencies(pool, sid)
    print(
        f"\npgbouncer transaction mode: slot->start over {len(steady)} runs before the kill: "
        f"median {statistics.median(steady):.3f}s p95 {_p95(steady):.3f}s; "
        f"all {len(every)} runs: median {statistics.median(every):.3f}s p95 {_p95(every):.3f}s; "
        f"takeover {takeover:.1f}s"
    )
    assert _p95(steady) < 1.5, steady
    for service in services:
        assert not service.has_event("listen.check_failed")
    assert survivor.has_event("stats.leader_acquired")


@pytest.mark.slow
async def test_without_the_direct_url_the_replica_is_not_ready_and_says_why(
    bouncer: PgBouncer, dsn: str, tmp_path: Path
) -> None:
    service = Service(dsn, tmp_path / "r.log", env=_service_env(bouncer, dsn, direct=False))
    try:
        await service.ready()
        failed = await service.wait_event("listen.check_failed")
        assert failed["level"] == "error" and "PROMPTSCHED_DIRECT_DATABASE_URL" in failed["hint"]
        status, body = await _readyz(service)
        assert status == 503 and "wake-ups are lost" in body["error"], body
        text = await _scrape(service)
        assert _gauge(text, "promptsched_listener_healthy") == 0
        assert 'promptsched_listener_checks_total{result="lost"} 1.0' in (text or "")
    finally:
        service.stop()
