"""Lease contention means contention: a claim (or a scheduler batch) is contended when rows it
could have taken were locked by another claimer at that moment, never because a run waits for
its own schedule's predecessor. Measured by the claim statement itself, with real locks held
by another connection, and with real processes racing for the same runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from promptsched.clock import Clock, FrozenClock
from promptsched.config import SchedulerSettings
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from promptsched.store import queries
from tests import factories
from tests.factories import EPOCH
from tests.helpers import Service, wait_until

LEASE = timedelta(seconds=30)


@asynccontextmanager
async def _held(pool: asyncpg.Pool[Any], table: str, ids: list[int]) -> AsyncIterator[None]:
    """Rows locked by another transaction (another replica's claim in flight) meanwhile."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(f"SELECT 1 FROM {table} WHERE id = ANY($1::bigint[]) FOR UPDATE", ids)
        yield


def _claims(metrics: Metrics) -> dict[str, float]:
    return {
        result: metrics.claims.labels(result)._value.get()
        for result in ("claimed", "empty", "contended")
    }


async def test_a_claim_counts_the_runs_another_claimer_held(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool)
    runs = [await factories.pending_run(pool, sid, EPOCH + timedelta(seconds=n)) for n in range(3)]
    async with _held(pool, "runs", runs[:1]):
        got = await queries.run_claim_batch(pool, None, "echo", 3, "w", LEASE)
        assert (sorted(row.id for row in got), got.claimable, got.contended) == (runs[1:], 3, 1)
        # Only the held run is left: nothing claimed, and it was contention, not emptiness.
        got = await queries.run_claim_batch(pool, None, "echo", 3, "w", LEASE)
        assert (list(got), got.claimable, got.contended) == ([], 1, 1)
    got = await queries.run_claim_batch(pool, None, "echo", 3, "w", LEASE)
    assert ([row.id for row in got], got.claimable, got.contended) == (runs[:1], 1, 0)
    got = await queries.run_claim_batch(pool, None, "echo", 3, "w", LEASE)
    assert (list(got), got.claimable, got.contended) == ([], 0, 0)


async def test_a_serial_run_waiting_for_its_predecessor_is_not_contention(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await factories.schedule(pool, overlap="buffer_one")
    first = await factories.pending_run(pool, sid, EPOCH - timedelta(minutes=2))
    waiting = await factories.pending_run(pool, sid, EPOCH - timedelta(minutes=1))
    await pool.execute("UPDATE runs SET serial = true WHERE schedule_id = $1", sid)
    [claimed] = await queries.run_claim_batch(pool, None, "echo", 4, "w", LEASE)
    assert claimed.id == first
    got = await queries.run_claim_batch(pool, None, "echo", 4, "w", LEASE)
    assert (list(got), got.claimable, got.contended) == ([], 0, 0)
    # But the predecessor, locked by another claimer as it is taken, is contention for both.
    await pool.execute(
        "UPDATE runs SET status = 'pending', attempt_id = NULL, lease_expires_at = NULL "
        "WHERE id = $1",
        first,
    )
    async with _held(pool, "runs", [first]):
        got = await queries.run_claim_batch(pool, None, "echo", 4, "w", LEASE)
        assert (list(got), got.claimable, got.contended) == ([], 1, 1)
    assert waiting not in {row.id for row in got}


async def test_the_worker_counts_one_result_per_claim(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool)
    rid = await factories.pending_run(pool, sid, EPOCH)
    metrics = Metrics()
    workers = factories.worker_pool(pool, Clock(), metrics)
    async with _held(pool, "runs", [rid]):
        assert await workers.run_once() == 0
    assert _claims(metrics) == {"claimed": 0, "empty": 0, "contended": 1}
    assert await workers.run_once() == 1
    after = _claims(metrics)
    # Drain mode looks again until nothing is in flight: empty claims, no more contention.
    assert (after["claimed"], after["contended"]) == (1, 1) and after["empty"] >= 1


async def test_a_scheduler_batch_counts_due_schedules_another_scheduler_held(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    due = [
        await factories.schedule(pool, expression="* * * * *", next_fire_at=EPOCH) for _ in range(3)
    ]
    metrics = Metrics()
    scheduler = Scheduler(pool, clock, metrics, SchedulerSettings(batch=10))
    async with _held(pool, "schedules", due[:2]):
        counts = await scheduler.run_once()
        assert counts.schedules == 1
    assert metrics.scheduler_batches.labels("contended")._value.get() == 1
    assert (await scheduler.run_once()).schedules == 2
    assert metrics.scheduler_batches.labels("taken")._value.get() == 1
    assert (await scheduler.run_once()).schedules == 0
    assert metrics.scheduler_batches.labels("empty")._value.get() == 1
    assert metrics.scheduler_batches.labels("contended")._value.get() == 1


async def test_pipelined_batches_of_one_scheduler_are_not_contention(
    pool: asyncpg.Pool[Any],
) -> None:
    # 25 due, batches of 10 pipelined two at a time: each batch finds its siblings' locks.
    clock = FrozenClock(EPOCH)
    for _ in range(25):
        await factories.schedule(pool, expression="* * * * *", next_fire_at=EPOCH)
    metrics = Metrics()
    counts = await Scheduler(
        pool, clock, metrics, SchedulerSettings(batch=10, pipeline=2, rush_batch=10)
    ).run_once()
    assert counts.schedules == 25
    assert metrics.scheduler_batches.labels("contended")._value.get() == 0
    assert metrics.scheduler_batches.labels("taken")._value.get() >= 3


# --- real processes -------------------------------------------------------------------------


async def _scrape(service: Service, name: str) -> dict[frozenset[tuple[str, str]], float]:
    port = service.has_event("api.listening")["port"]  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


async def _claims_of(service: Service) -> dict[str, float]:
    samples = await _scrape(service, "promptsched_claims_total")
    return {dict(labels)["result"]: value for labels, value in samples.items()}


@pytest.mark.slow
async def test_two_processes_racing_for_a_backlog_count_contended_claims(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    # Work arrives in small bursts, each announced by NOTIFY, which wakes both processes at
    # once: both claim the same few runs, and one finds them locked by the other. Whether a
    # given burst races is up to the machine, so bursts continue until one did (bounded).
    env = {"PROMPTSCHED_WORKERS": "4", "PROMPTSCHED_ROLES": "worker,api"}
    services = [Service(dsn, tmp_path / f"w{i}.log", env=env) for i in range(2)]
    sid = await factories.schedule(pool, next_fire_at=None)
    try:
        for service in services:
            await service.ready()

        async def contended() -> float:
            return sum([(await _claims_of(s)).get("contended", 0.0) for s in services])

        for burst in range(300):
            now = await pool.fetchval("SELECT now()")
            ids = [
                await factories.pending_run(pool, sid, now + timedelta(microseconds=n), "manual")
                for n in range(2)
            ]
            await queries.run_notify_ready(pool, "burst")

            async def taken(ids: list[int] = ids) -> bool:
                return not await pool.fetchval(
                    "SELECT count(*) FROM runs WHERE id = ANY($1::bigint[]) AND status = 'pending'",
                    ids,
                )

            await wait_until(taken, timeout=10, what=f"burst {burst} to be claimed")
            if burst % 5 == 4 and await contended() > 0:
                break
        total = await contended()
        claims = [await _claims_of(s) for s in services]
    finally:
        for service in services:
            service.stop()
    assert total > 0, claims
    # Each run ran once: the losers of a race skipped the winner's rows, never doubled them.
    attempts = await pool.fetch("SELECT attempts FROM runs WHERE schedule_id = $1", sid)
    assert {row["attempts"] for row in attempts} <= {0, 1}


@pytest.mark.slow
async def test_one_process_with_buffer_one_runs_waiting_counts_no_contention(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    # A per-second schedule whose runs take 2s, overlap buffer_one: a run always waits behind
    # its running predecessor while the worker keeps looking for work. Nobody else claims.
    service = Service(dsn, tmp_path / "solo.log")
    try:
        await service.ready()
        sid = await factories.ticking_schedule(pool, params={"latency": "2s"}, overlap="buffer_one")

        async def waited_and_ran() -> bool:
            rows = await pool.fetch(
                "SELECT status FROM runs WHERE schedule_id = $1 AND origin = 'cadence'", sid
            )
            statuses = [row["status"] for row in rows]
            return statuses.count("succeeded") >= 2 and "pending" in statuses

        await wait_until(waited_and_ran, timeout=30, what="buffered runs to wait and run")
        claims = await _claims_of(service)
        await pool.execute("UPDATE schedules SET next_fire_at = NULL WHERE id = $1", sid)
    finally:
        service.stop()
    # The worker did look while a run was waiting (empty claims), and found no contention.
    assert claims["empty"] >= 1, claims
    assert claims["contended"] == 0, claims
