"""Poison work: a schedule whose every attempt crashes the executor, or hangs forever, ends
dead after its attempts, frees its worker slot each time, and never starves other schedules."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from promptsched.clock import FrozenClock
from promptsched.config import WorkerSettings
from promptsched.executors.base import ExecutionRequest, ExecutionResult, Registry
from promptsched.executors.echo import EchoExecutor
from promptsched.executors.limiter import Limiter
from promptsched.metrics import Metrics
from promptsched.roles.worker import WorkerPool
from promptsched.roles.worker.heartbeat import Heartbeat
from tests import factories
from tests.factories import EPOCH, runs_settled
from tests.helpers import Service, wait_until

HEALTHY = 12


class CrashingExecutor:
    """An executor with a bug: every call raises something outside the executor error tree."""

    name = "crashing"

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        self.calls += 1
        raise KeyError(f"bug on attempt {request.attempt}")

    async def aclose(self) -> None:
        return None


def _worker(pool: asyncpg.Pool[Any], clock: FrozenClock, metrics: Metrics) -> WorkerPool:
    heartbeat = Heartbeat(
        pool, clock, metrics, lease=timedelta(seconds=30), interval=timedelta(seconds=10)
    )
    return WorkerPool(
        pool,
        clock,
        metrics,
        Registry({"echo": EchoExecutor(), "crashing": CrashingExecutor()}),
        {"echo": Limiter(100), "crashing": Limiter(100)},
        heartbeat,
        WorkerSettings(slots=2, worker_id="poison-test"),
    )


async def _healthy_runs(pool: asyncpg.Pool[Any]) -> list[int]:
    sid = await factories.schedule(pool, prompt="healthy")
    return [
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=i)) for i in range(HEALTHY)
    ]


async def _statuses(pool: asyncpg.Pool[Any], ids: list[int]) -> list[str]:
    rows = await pool.fetch("SELECT status FROM runs WHERE id = ANY($1) ORDER BY id", ids)
    return [row["status"] for row in rows]


def _busy(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("promptsched_worker_slots", {"state": "busy"})


async def _drain_all_attempts(worker: WorkerPool, clock: FrozenClock, rounds: int) -> None:
    """Run everything due, then move past any retry backoff, ``rounds`` times."""
    for _ in range(rounds):
        await worker.run_once()
        clock.advance(timedelta(hours=2))


async def test_an_executor_that_crashes_every_attempt_goes_dead_and_frees_its_slot(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    poison = await factories.schedule(pool, prompt="crash me", max_attempts=3)
    await pool.execute("UPDATE schedules SET provider = 'crashing' WHERE id = $1", poison)
    bad = await pool.fetchval(
        "INSERT INTO runs (schedule_id, slot, provider, max_attempts, available_at) "
        "VALUES ($1, $2, 'crashing', 3, $2) RETURNING id",
        poison,
        EPOCH,
    )
    healthy = await _healthy_runs(pool)
    worker = _worker(pool, clock, metrics)
    with capture_logs() as logs:
        await _drain_all_attempts(worker, clock, rounds=4)
    run = await pool.fetchrow("SELECT * FROM runs WHERE id = $1", bad)
    assert run is not None
    assert (run["status"], run["attempts"]) == ("dead", 3)
    assert run["error"] == "executor crashed: KeyError('bug on attempt 3')"
    assert len([e for e in logs if e["event"] == "attempt.executor_crashed"]) == 3
    assert await _statuses(pool, healthy) == ["succeeded"] * HEALTHY
    assert worker.inflight == {} and _busy(metrics) == 0  # every slot came back


async def test_stored_params_that_crash_the_echo_executor_end_dead(
    pool: asyncpg.Pool[Any],
) -> None:
    """Params the API would refuse (stored before validation existed, or written by hand)
    make the executor raise outside its error tree: that is a crash, retried, then dead."""
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    poison = await factories.schedule(pool, params={"latency": "not-a-duration"}, max_attempts=2)
    bad = await factories.pending_run(pool, poison)
    healthy = await _healthy_runs(pool)
    worker = _worker(pool, clock, metrics)
    await _drain_all_attempts(worker, clock, rounds=3)
    run = await pool.fetchrow("SELECT status, attempts, error FROM runs WHERE id = $1", bad)
    assert run is not None
    assert (run["status"], run["attempts"]) == ("dead", 2)
    assert run["error"].startswith("executor crashed: ValidationError(")
    assert await _statuses(pool, healthy) == ["succeeded"] * HEALTHY
    assert worker.inflight == {} and _busy(metrics) == 0


async def test_an_attempt_that_hangs_times_out_goes_dead_and_others_run_meanwhile(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    hanging = await factories.schedule(
        pool, params={"latency": "1d"}, timeout=timedelta(seconds=1), max_attempts=2
    )
    stuck = await factories.pending_run(pool, hanging)
    healthy = await _healthy_runs(pool)
    worker = _worker(pool, clock, metrics)
    with capture_logs() as logs:
        await _drain_all_attempts(worker, clock, rounds=3)
    run = await pool.fetchrow("SELECT status, attempts, error FROM runs WHERE id = $1", stuck)
    assert run is not None
    assert (run["status"], run["attempts"], run["error"]) == ("dead", 2, "timed out after 1s")
    assert await _statuses(pool, healthy) == ["succeeded"] * HEALTHY
    # The healthy runs went through the other slot while the first attempt hung.
    order = [e["run_id"] for e in logs if e["event"] in ("run.succeeded", "run.pending")]
    assert order.index(stuck) >= HEALTHY, order
    assert worker.inflight == {} and _busy(metrics) == 0


async def _busy_slots(port: int) -> float:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "promptsched_worker_slots" and sample.labels["state"] == "busy":
                return sample.value
    raise AssertionError("promptsched_worker_slots not exported")


@pytest.mark.slow
async def test_poison_schedules_do_not_starve_a_healthy_one_in_a_real_service(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    svc = Service(dsn, tmp_path / "svc.log", env={"PROMPTSCHED_WORKERS": "2"})
    try:
        await svc.ready()
        port = svc.has_event("api.listening")["port"]  # type: ignore[index]
        now = await pool.fetchval("SELECT date_trunc('second', now()) + interval '1 second'")
        crash = await factories.schedule(
            pool,
            expression="*/2 * * * * *",
            params={"latency": "not-a-duration"},
            max_attempts=2,
            next_fire_at=now,
        )
        hang = await factories.schedule(
            pool,
            expression="*/3 * * * * *",
            params={"latency": "1d"},
            timeout=timedelta(seconds=1),
            max_attempts=2,
            next_fire_at=now,
        )
        healthy = await factories.schedule(
            pool, expression="* * * * * *", overlap="allow", next_fire_at=now
        )

        async def poisoned_enough() -> bool:
            dead = await pool.fetchval(
                "SELECT count(*) FROM runs WHERE status = 'dead' AND schedule_id = ANY($1) "
                "GROUP BY schedule_id ORDER BY 1 LIMIT 1",
                [crash, hang],
            )
            both = await pool.fetchval(
                "SELECT count(DISTINCT schedule_id) FROM runs "
                "WHERE status = 'dead' AND schedule_id = ANY($1)",
                [crash, hang],
            )
            return bool(both == 2 and dead >= 3)

        await wait_until(poisoned_enough, timeout=40, what="three dead runs of each poison")
        await pool.execute(
            "UPDATE schedules SET next_fire_at = NULL WHERE id = ANY($1)", [crash, hang, healthy]
        )

        await wait_until(lambda: runs_settled(pool), timeout=30, what="every run to finish")

        async def idle() -> bool:
            return await _busy_slots(port) == 0

        await wait_until(idle, timeout=5, what="both worker slots free again")
        assert svc.process.poll() is None
    finally:
        assert svc.stop() == 0
    rows = await pool.fetch(
        "SELECT schedule_id, slot, status, error FROM runs WHERE schedule_id = ANY($1) "
        "ORDER BY slot",
        [crash, hang, healthy],
    )
    by = {
        sid: [(r["status"], r["error"]) for r in rows if r["schedule_id"] == sid]
        for sid in (crash, hang, healthy)
    }
    assert {s for s, _ in by[crash]} <= {"dead", "skipped"}
    assert all(e.startswith("executor crashed") for s, e in by[crash] if s == "dead")
    assert {s for s, _ in by[hang]} <= {"dead", "skipped"}
    assert all(e == "timed out after 1s" for s, e in by[hang] if s == "dead")
    # Meanwhile the healthy per-second schedule ran every one of its slots.
    slots = [r["slot"] for r in rows if r["schedule_id"] == healthy]
    assert {s for s, _ in by[healthy]} == {"succeeded"}, by[healthy]
    assert [(s - slots[0]).total_seconds() for s in slots] == list(range(len(slots)))
    assert len(slots) >= 6
