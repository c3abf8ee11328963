"""Database outages: a real service rides out Postgres being stopped and started again (not
ready meanwhile, retrying with backoff, in-flight attempts stopped, everything resumed with
missed slots under the misfire policy), and each role survives the errors a dying connection
raises (regressions found by the chaos suite, tests/chaos)."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiohttp
import anyio
import asyncpg
import pytest
from structlog.testing import capture_logs

from promptsched.clock import Clock, FrozenClock
from promptsched.config import ReaperSettings
from promptsched.domain import Schedule
from promptsched.metrics import FENCED_WRITE_KINDS, Metrics
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from promptsched.roles.reaper import Reaper
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.roles.worker.inflight import InFlight
from promptsched.store import listen, migrate, queries
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres
from promptsched.web import auth
from tests import factories
from tests.chaos import checker
from tests.factories import EPOCH, attempt_statuses, run_row
from tests.helpers import Service, admin_execute, wait_until

# Lines a process may log about failed round trips in one second of an outage.
RETRY_LINES_PER_SECOND = 15


# --- a service process through a real outage -----------------------------------------------


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own: these tests stop it, which the session one must never."""
    data_dir = Path(tempfile.mkdtemp(prefix="pso-", dir="/tmp"))
    server = EmbeddedPostgres(data_dir, fast_unsafe=True)
    server.ensure_running()
    yield server
    server.stop("immediate")
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
async def outage_db(own_postgres: EmbeddedPostgres) -> AsyncIterator[str]:
    name = f"o_{uuid4().hex[:12]}"
    await admin_execute(own_postgres, f"CREATE DATABASE {name}")
    conn = await pools.connect(own_postgres.dsn(name))
    try:
        await migrate.apply(conn)
    finally:
        await conn.close()
    yield own_postgres.dsn(name)
    own_postgres.ensure_running()  # a failed test may have left it stopped
    await admin_execute(own_postgres, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def _status(port: int, path: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status


def _retry_lines_per_second(svc: Service) -> Counter[str]:
    return Counter(
        str(e.get("timestamp", ""))[:19] for e in svc.events() if e["event"] in checker.RETRY_EVENTS
    )


_NAMES = itertools.count(1)


async def _create(dsn: str, **raw: Any) -> Schedule:
    conn = await pools.connect(dsn)
    try:
        named = {"name": f"outage {next(_NAMES)}", "prompt": "p"}  # names are unique per owner
        values = inputs.validate({**named, **raw}, providers=["echo"])
        return await schedule_ops.create_schedule(conn, Clock(), values, owner="o")
    finally:
        await conn.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_the_service_rides_out_postgres_stopped_and_started_again(
    own_postgres: EmbeddedPostgres, outage_db: str, tmp_path: Path
) -> None:
    dsn = outage_db
    svc = Service(dsn, tmp_path / "svc.log")  # lease 2s, heartbeat 500ms
    try:
        await svc.ready()
        port = svc.has_event("api.listening")["port"]  # type: ignore[index]
        # A per-second cadence that counts late slots after 500ms: an outage of a few seconds
        # leaves missed slots for the misfire policy (run_once: one coalesced run).
        cadence = await _create(
            dsn, cron="* * * * * *", misfire="run_once", misfire_grace="500ms", overlap="allow"
        )
        # A run in flight when the database goes: 6s of work, far past the 2s lease.
        slow = await _create(dsn, at="2099-01-01T00:00:00Z", params={"latency": "6s"})
        conn = await pools.connect(dsn)
        try:
            run_id = (await schedule_ops.trigger_schedule(conn, Clock(), slow.id, owner=None,
                                                     actor="t"))["id"]  # fmt: skip
            token, _ = await auth.create_token(conn, owner="o")
        finally:
            await conn.close()
        probe = await pools.connect(dsn)
        try:

            async def running() -> bool:
                status = await probe.fetchval("SELECT status FROM runs WHERE id = $1", run_id)
                return bool(status == "running")

            await wait_until(running, timeout=15, what="the slow run to start")
        finally:
            await probe.close()
        await svc.wait_event("scheduler.ticked", timeout=10)
        assert await _status(port, "/readyz") == 200

        await anyio.to_thread.run_sync(own_postgres.stop, "fast")

        async def not_ready() -> bool:
            return await _status(port, "/readyz") == 503

        await wait_until(not_ready, timeout=10, what="/readyz to answer 503")
        assert await _status(port, "/healthz") == 200  # alive, only not ready
        for _ in range(5):  # the API says the database is away, not that it broke
            assert await _status(port, "/v1/schedules", token) == 503
        # The attempt cannot renew its lease: past the lease it stops, before it could write.
        fenced = await svc.wait_event("attempt.fenced", run_id=run_id, timeout=15)
        assert fenced["reason"] == "heartbeat_unreachable"

        async def backed_off() -> list[float]:
            errors = [e for e in svc.events() if e["event"] == "role.error"]
            delays = [e["retry_in"] for e in errors if e["role"] == "scheduler"]
            return delays if len(delays) >= 4 else []

        delays = await wait_until(backed_off, timeout=20, what="the scheduler to back off")
        assert delays == sorted(delays) and delays[-1] >= 4 * delays[0], delays
        assert svc.process.poll() is None, "the service died in the outage"
        busiest = max(_retry_lines_per_second(svc).values())
        assert busiest <= RETRY_LINES_PER_SECOND, f"{busiest} retry lines in one second"

        await anyio.to_thread.run_sync(own_postgres.ensure_running)

        async def ready() -> bool:
            return await _status(port, "/readyz") == 200

        await wait_until(ready, timeout=20, what="/readyz to answer 200 again")
        await svc.wait_event("role.recovered", role="scheduler", timeout=20)
        pool = await pools.create_pool(dsn, max_size=2)
        try:

            async def finished() -> bool:
                row = await pool.fetchrow("SELECT status FROM runs WHERE id = $1", run_id)
                return row is not None and row["status"] == "succeeded"

            await wait_until(finished, timeout=30, what="the interrupted run to succeed")
            attempts = await pool.fetch(
                "SELECT status, attempt_id FROM run_attempts WHERE run_id = $1 ORDER BY number",
                run_id,
            )
            assert [a["status"] for a in attempts] == ["lost", "succeeded"]
            assert str(attempts[0]["attempt_id"]) == fenced["attempt_id"]

            async def coalesced() -> bool:
                return bool(
                    await pool.fetchval(
                        "SELECT count(*) FROM runs WHERE schedule_id = $1 AND missed_slots > 0",
                        cadence.id,
                    )
                )

            await wait_until(coalesced, timeout=20, what="the missed slots to be coalesced")
            ends = await pool.fetch(
                "WITH old AS (SELECT id, next_fire_at FROM schedules WHERE id = $1 FOR UPDATE) "
                "UPDATE schedules s SET next_fire_at = NULL FROM old WHERE s.id = old.id "
                "RETURNING old.next_fire_at",
                cadence.id,
            )
            rows = await pool.fetch(
                "SELECT * FROM runs WHERE schedule_id = $1 ORDER BY slot", cadence.id
            )
            schedule = await pool.fetchrow("SELECT * FROM schedules WHERE id = $1", cadence.id)
        finally:
            await pool.close()
    finally:
        code = svc.stop()
    assert code == 0
    # Every slot from the first to the end of the window: its own row, or counted as missed
    # in the one run_once row after the outage; and after it the cadence went on, on time.
    assert schedule is not None
    assert not checker.slot_problems(
        schedule, cadence.next_fire_at, ends[0]["next_fire_at"], rows
    ), [dict(r) for r in rows]
    # run_once: one run for the latest late slot, or, when slots on time were found in the
    # same tick, those run and the late ones are one skipped "misfire" row.
    late = [r for r in rows if r["missed_slots"] > 0]
    assert len(late) == 1, [dict(r) for r in late]
    assert (late[0]["status"], late[0]["skip_reason"]) in (
        ("succeeded", None),
        ("skipped", "misfire"),
    )
    assert late[0]["missed_slots"] >= 1  # the database was down for seconds
    assert rows[-1]["slot"] > late[0]["slot"]


# --- each role survives what a dying connection raises ------------------------------------


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_finish_that_cannot_reach_the_database_leaves_the_run_to_the_reaper(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock(EPOCH)
    rid = await factories.pending_run(pool, await factories.schedule(pool))

    async def unreachable(*args: Any) -> Any:
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(queries, "run_finish_many", unreachable)
    metrics = Metrics()
    worker = factories.worker_pool(pool, clock, metrics, lease=timedelta(seconds=30))
    with capture_logs() as logs:
        assert await worker.run_once() == 1  # the pool survived the failed write
    assert [e["status"] for e in logs if e["event"] == "attempt.finalize_failed"] == ["succeeded"]
    assert _sample(metrics, "promptsched_role_errors_total", role="worker") == 1
    assert (await run_row(pool, rid))["status"] == "running"  # the lease will expire
    monkeypatch.undo()
    clock.advance(timedelta(seconds=31))
    await Reaper(
        pool, clock, Metrics(), ReaperSettings(deadline_grace=timedelta(seconds=30))
    ).run_once()
    assert await worker.run_once() == 1
    assert (await run_row(pool, rid))["status"] == "succeeded"
    assert await attempt_statuses(pool, rid) == ["lost", "succeeded"]


async def test_a_heartbeat_that_finds_the_run_finished_by_its_own_attempt_fences_nothing(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    metrics = Metrics()
    worker = factories.worker_pool(pool, FrozenClock(EPOCH), metrics)
    finish_many = queries.run_finish_many

    async def finish_then_heartbeat(*args: Any) -> set[int]:
        landed = await finish_many(*args)
        await worker.heartbeat.run_once()  # lands after the finish, before the attempt leaves
        return landed

    monkeypatch.setattr(queries, "run_finish_many", finish_then_heartbeat)
    with capture_logs() as logs:
        assert await worker.run_once() == 1
    assert (await run_row(pool, rid))["status"] == "succeeded"
    assert not [e for e in logs if e["event"] == "attempt.fenced"]
    for kind in FENCED_WRITE_KINDS:
        assert _sample(metrics, "promptsched_fenced_writes_total", kind=kind) == 0, kind


async def test_the_worker_survives_any_error_a_claim_raises(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    claim = queries.run_claim_batch
    calls = 0

    async def dying_connection(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # what asyncpg raised in the chaos suite after a Postgres restart
            raise asyncpg.exceptions.InternalClientError(
                "cannot switch to state 12; another operation (2) is in progress"
            )
        return await claim(*args)

    monkeypatch.setattr(queries, "run_claim_batch", dying_connection)
    metrics = Metrics()
    worker = factories.worker_pool(pool, Clock(), metrics)

    async def succeeded() -> bool:
        return bool((await run_row(pool, rid))["status"] == "succeeded")

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_until(succeeded, timeout=10, what="the run to succeed after the failed claim")
        tg.cancel_scope.cancel()
    assert _sample(metrics, "promptsched_role_errors_total", role="worker") == 1


@pytest.mark.parametrize("database", ["refuses", "hangs"])
async def test_a_heartbeat_that_cannot_reach_the_database_stops_its_attempts_after_the_lease(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch, database: str
) -> None:
    async def unreachable(*args: Any) -> Any:
        if database == "hangs":  # a partition that drops packets: no error, no answer
            await anyio.sleep_forever()
        # what asyncpg raised in the chaos suite on a connection to a restarted server
        raise asyncpg.exceptions.InternalClientError("another operation is in progress")

    monkeypatch.setattr(queries, "run_heartbeat_many", unreachable)
    metrics = Metrics()
    heartbeat = Heartbeat(
        pool, Clock(), metrics, lease=timedelta(seconds=1), interval=timedelta(milliseconds=200)
    )
    running = InFlight(1, uuid4(), "echo", None)
    finishing = InFlight(2, uuid4(), "echo", None, finishing=True)
    heartbeat.inflight.add(running)
    heartbeat.inflight.add(finishing)

    async def fenced() -> bool:
        return running.fenced

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(heartbeat.run)
            await wait_until(fenced, timeout=5, what="the attempt to be stopped")
            tg.cancel_scope.cancel()
    assert running.fenced and running.deadline is None
    assert [e["reason"] for e in logs if e["event"] == "attempt.fenced"] == [
        "heartbeat_unreachable"
    ]
    assert not finishing.fenced  # its final write is guarded by itself
    assert len([e for e in logs if e["event"] == "heartbeat.failed"]) >= (
        4 if database == "refuses" else 1
    )


async def test_the_listener_survives_a_connection_that_dies_while_subscribing(
    dsn: str, pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    connect = pools.connect
    calls = 0

    async def flaky_connect(target: str, **kwargs: Any) -> asyncpg.Connection[Any]:
        nonlocal calls
        calls += 1
        conn = await connect(target, **kwargs)
        if calls == 2:
            await conn.close()  # gone before LISTEN
        return conn

    monkeypatch.setattr(pools, "connect", flaky_connect)
    heard: list[str | None] = []
    listener = listen.Listener(dsn, {listen.CHANNEL_RUNS: heard.append})

    async def resubscribed() -> bool:
        return listener.connected and calls >= 3

    async def notified() -> bool:
        return "after" in heard

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(listener.run)
            await pool.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'promptsched-listen' AND datname = current_database()"
            )
            await wait_until(resubscribed, timeout=20, what="the listener to subscribe again")
            await pool.execute("SELECT pg_notify($1, 'after')", listen.CHANNEL_RUNS)
            await wait_until(notified, timeout=10, what="a notification after the reconnect")
            tg.cancel_scope.cancel()
    assert [e for e in logs if e["event"] == "listen.subscribe_failed"]
    assert None in heard  # handlers were told notifications may have been missed


def test_the_chaos_checker_catches_a_slot_without_a_row() -> None:
    """The checker's slot walk can fail (it is what the outage test relies on)."""
    schedule = {"id": 1, "kind": "cron", "expression": "* * * * * *", "timezone": "UTC",
                "dst_gap": "shift", "dst_fold": "first"}  # fmt: skip
    rows = [{"id": 1, "slot": EPOCH, "missed_slots": 0},
            {"id": 2, "slot": EPOCH + timedelta(seconds=3), "missed_slots": 1}]  # fmt: skip
    problems = checker.slot_problems(
        schedule,  # type: ignore[arg-type]
        EPOCH,
        EPOCH + timedelta(seconds=4),
        rows,  # type: ignore[arg-type]
    )
    assert problems == [
        "schedule 1: row at 2026-03-02T09:00:03+00:00 stands for 1 missed slots, "
        "2 had no row before it"
    ]


# --- a crash of Postgres itself loses the commits that do not wait ------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_postgres_crash_mid_drain_loses_no_run_and_doubles_no_finish(
    own_postgres: EmbeddedPostgres, outage_db: str, tmp_path: Path
) -> None:
    """Claims, lease renewals and ticks commit without waiting for their WAL flush; an immediate
    stop of the server (its WAL buffers are lost, as in a crash) mid-drain must still leave every
    run finished exactly once, by the attempt its run row names, with every attempt a claim lost
    fenced before it could write (docs/reliability.md, "Which commits wait")."""
    dsn = outage_db
    work = await _create(dsn, at="2099-01-01T00:00:00Z", params={"latency": "100ms"})
    pool = await pools.create_pool(dsn, max_size=2)
    try:
        # This module's server runs with synchronous_commit off (a throwaway test server); as
        # deployments run, this database's commits wait unless a statement says otherwise.
        # (fsync stays off: an immediate stop loses what is not yet written, not what is.)
        name = await pool.fetchval("SELECT current_database()")
        await pool.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
        await pool.execute(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
            "SELECT $1, now() + g * interval '1 millisecond', 'manual', 'echo', 5, now() "
            "FROM generate_series(1, 400) g",
            work.id,
        )
    finally:
        await pool.close()
    svc = Service(
        dsn,
        tmp_path / "svc.log",
        env={"PROMPTSCHED_WORKERS": "16", "PROMPTSCHED_LOG_LEVEL": "debug"},
    )
    try:
        await svc.ready()
        probe = await pools.connect(dsn)
        try:

            async def some_done() -> bool:
                done = await probe.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'")
                return bool(done >= 60)

            await wait_until(some_done, timeout=30, what="the drain to be under way")
        finally:
            await probe.close()
        await anyio.to_thread.run_sync(own_postgres.stop, "immediate")
        await anyio.to_thread.run_sync(own_postgres.ensure_running)
        pool = await pools.create_pool(dsn, max_size=2)
        try:

            async def drained() -> bool:
                left = await pool.fetchval(
                    "SELECT count(*) FROM runs WHERE status IN ('pending', 'running')"
                )
                return left == 0

            await wait_until(drained, timeout=90, what="every run to finish after the crash")
            runs = await pool.fetch("SELECT id, status, attempt_id FROM runs ORDER BY id")
            attempts = await pool.fetch(
                "SELECT run_id, attempt_id, number, status FROM run_attempts "
                "ORDER BY run_id, number"
            )
        finally:
            await pool.close()
        events = svc.events()
    finally:
        code = svc.stop()
    assert code == 0
    assert len(runs) == 400
    assert {r["status"] for r in runs} == {"succeeded"}
    by_run: dict[int, list[Any]] = {}
    for a in attempts:
        by_run.setdefault(a["run_id"], []).append(a)
    for run in runs:
        history = by_run[run["id"]]
        # One succeeded attempt, the one its run row names, and it is the last.
        assert [a["status"] for a in history].count("succeeded") == 1, history
        assert history[-1]["attempt_id"] == run["attempt_id"], history
        numbers = [a["number"] for a in history]
        assert numbers == sorted(set(numbers)), history
    # An attempt this process started that left no row at all had its claim lost in the
    # crash: it wrote nothing, because its final write was rejected (fenced) or never reached
    # the server (finalize_failed), and its run was claimed again.
    recorded = {str(a["attempt_id"]) for a in attempts}
    started = {e["attempt_id"] for e in events if e["event"] == "attempt.started"}
    wrote_nothing = {
        e["attempt_id"]
        for e in events
        if e["event"] in ("attempt.fenced", "attempt.finalize_failed")
    }
    assert started - recorded <= wrote_nothing, sorted(started - recorded - wrote_nothing)
    # A finish waits for its flush: every success the process saw land is the one that stands.
    landed = {(e["run_id"], e["attempt_id"]) for e in events if e["event"] == "run.succeeded"}
    stands = {(r["id"], str(r["attempt_id"])) for r in runs}
    assert landed <= stands, sorted(landed - stands)
