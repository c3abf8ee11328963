"""Acceptance of the durable core with real `promptsched run` processes and real signals."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests import factories
from tests.factories import attempt_rows, attempt_statuses, run_row, runs_settled
from tests.helpers import Service, assert_every_second_once, wait_until

pytestmark = pytest.mark.slow


async def _running_on(pool: asyncpg.Pool[Any], run_id: int, service: Service) -> bool:
    row = await run_row(pool, run_id)
    return row["status"] == "running" and str(row["worker_id"]).endswith(f":{service.pid}")


async def _manual_run(pool: asyncpg.Pool[Any], **schedule: Any) -> int:
    # A schedule that never fires by itself (no cursor), and one run owed now.
    sid = await factories.schedule(pool, next_fire_at=None, **schedule)
    return await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")


async def _scrape(service: Service) -> str:
    """The service's /metrics, as a scraper reads it."""
    port = service.has_event("api.listening")["port"]  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            return await response.text()


async def _metric(service: Service, name: str) -> float:
    """The sum of every series of ``name`` (all its label values)."""
    text = await _scrape(service)
    found = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    ]
    if not found:
        raise AssertionError(f"{name} not exported")
    return sum(found)


async def test_two_processes_make_exactly_one_run_per_second_slot(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    services = [Service(dsn, tmp_path / f"s{i}.log") for i in range(2)]
    try:
        for service in services:
            await service.ready()
        # overlap "allow": every slot must run even when the machine is slow, so no slot is
        # legitimately skipped because its predecessor had not finished yet.
        sid = await factories.ticking_schedule(pool, overlap="allow", announce=False)

        async def enough() -> bool:
            count = await pool.fetchval(
                "SELECT count(*) FROM runs WHERE schedule_id = $1 AND status = 'succeeded'", sid
            )
            return bool(count >= 5)

        await wait_until(enough, timeout=20, what="five succeeded runs")
        # Stop ticking (no cursor; disabling would skip the runs still queued), then let
        # everything owed finish.
        await pool.execute("UPDATE schedules SET next_fire_at = NULL WHERE id = $1", sid)

        await wait_until(lambda: runs_settled(pool), timeout=20, what="all runs finished")
    finally:
        codes = [service.stop() for service in services]
    rows = await pool.fetch(
        "SELECT slot, status, attempts FROM runs WHERE schedule_id = $1 ORDER BY slot", sid
    )
    assert_every_second_once([row["slot"] for row in rows])
    assert {row["status"] for row in rows} == {"succeeded"}
    assert {row["attempts"] for row in rows} == {1}
    # Both processes ran the scheduler; together they never double-enqueued.
    assert codes == [0, 0]


async def test_sigkill_of_the_holder_another_process_finishes_after_the_lease(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    first = Service(dsn, tmp_path / "first.log")
    second: Service | None = None
    try:
        await first.ready()
        rid = await _manual_run(pool, params={"latency": "2s"})
        await wait_until(lambda: _running_on(pool, rid, first), timeout=10, what="first claims")
        first.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        second = Service(dsn, tmp_path / "second.log")
        await second.ready()

        async def succeeded() -> bool:
            return bool((await run_row(pool, rid))["status"] == "succeeded")

        await wait_until(succeeded, timeout=20, what="the run to succeed on the second process")
        recovered = time.monotonic() - killed_at
    finally:
        first.stop()
        if second is not None:
            second.stop()
    attempts = await attempt_rows(pool, rid)
    assert [a["status"] for a in attempts] == ["lost", "succeeded"]
    assert attempts[0]["worker_id"].endswith(f":{first.pid}")
    assert attempts[1]["worker_id"].endswith(f":{second.pid}")
    assert (await run_row(pool, rid))["attempts"] == 2
    # lease 2s + run 2s + process start: well under the 20s bound above.
    assert recovered < 12


async def test_sigstop_past_the_lease_the_frozen_attempt_is_fenced(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    frozen = Service(dsn, tmp_path / "frozen.log")
    rescuer: Service | None = None
    try:
        await frozen.ready()
        rid = await _manual_run(pool, params={"latency": "2s"})
        await wait_until(lambda: _running_on(pool, rid, frozen), timeout=10, what="claim")
        frozen.signal(signal.SIGSTOP)
        rescuer = Service(dsn, tmp_path / "rescuer.log")

        async def finished_by_rescuer() -> bool:
            return bool((await run_row(pool, rid))["status"] == "succeeded")

        await wait_until(finished_by_rescuer, timeout=20, what="the rescuer to finish the run")
        before = dict(await run_row(pool, rid))
        frozen.signal(signal.SIGCONT)
        await frozen.wait_event("attempt.fenced", timeout=15, run_id=rid)
        assert await _metric(frozen, "promptsched_fenced_writes_total") >= 1
        after = dict(await run_row(pool, rid))
    finally:
        frozen.stop()
        if rescuer is not None:
            rescuer.stop()
    assert after == before, "the frozen attempt's late write changed the run"
    attempts = await attempt_rows(pool, rid)
    assert [a["status"] for a in attempts] == ["lost", "succeeded"]
    assert attempts[1]["worker_id"].endswith(f":{rescuer.pid}")


async def test_sigterm_hands_an_in_flight_run_over_well_under_the_lease(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    slow_lease = {
        "PROMPTSCHED_LEASE": "20s",
        "PROMPTSCHED_HEARTBEAT": "2s",
        "PROMPTSCHED_DRAIN_GRACE": "500ms",
    }
    leaving = Service(dsn, tmp_path / "leaving.log", env=slow_lease)
    staying: Service | None = None
    try:
        await leaving.ready()
        rid = await _manual_run(pool, params={"latency": "60s"})
        await wait_until(lambda: _running_on(pool, rid, leaving), timeout=10, what="claim")
        staying = Service(dsn, tmp_path / "staying.log", env=slow_lease)
        await staying.ready()
        started = time.monotonic()
        leaving.signal(signal.SIGTERM)
        await wait_until(lambda: _running_on(pool, rid, staying), timeout=15, what="hand-off")
        handoff = time.monotonic() - started
        assert leaving.process.wait(10) == 0
    finally:
        leaving.stop()
        if staying is not None:
            staying.stop()
    attempts = await attempt_rows(pool, rid)
    assert attempts[0]["status"] == "released"
    # Drain grace 0.5s; the lease (20s) never had to expire.
    assert handoff < 5, handoff
    assert (await run_row(pool, rid))["releases"] >= 1


async def test_retries_and_dead_letters_with_echo_failure_injection(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    service = Service(dsn, tmp_path / "svc.log")
    try:
        await service.ready()
        flaky = await _manual_run(pool, params={"fail_attempts": 2}, max_attempts=3)
        doomed = await _manual_run(pool, params={"fail_attempts": 5}, max_attempts=2)

        async def done() -> bool:
            statuses = {(await run_row(pool, r))["status"] for r in (flaky, doomed)}
            return statuses <= {"succeeded", "dead"}

        await wait_until(done, timeout=20, what="both runs to finish")
    finally:
        service.stop()
    assert await attempt_statuses(pool, flaky) == [
        "failed",
        "failed",
        "succeeded",
    ]
    assert (await run_row(pool, flaky))["status"] == "succeeded"
    dead = await run_row(pool, doomed)
    assert (dead["status"], dead["attempts"]) == ("dead", 2)
    assert dead["error"] == "echo: injected failure on attempt 2"


async def _gc_collections(service: Service) -> dict[str, float]:
    """python_gc_collections_total per generation, as /metrics exports it."""
    text = await _scrape(service)
    prefix = 'python_gc_collections_total{generation="'
    return {
        line[len(prefix)]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


async def test_a_drain_leaves_the_startup_heap_to_itself(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    """Startup's objects are frozen and the young generation is large (promptsched/heap.py):
    3,000 runs on 64 slots take a few young collections and no older one. CPython's default
    thresholds take 80-90 young collections and 7 older ones for as many runs."""
    service = Service(dsn, tmp_path / "svc.log", env={"PROMPTSCHED_WORKERS": "64"})
    try:
        ready = await service.ready()
        assert ready["heap_frozen"] > 10_000, ready
        sid = await factories.schedule(pool, next_fire_at=None)
        await pool.execute(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts) "
            "SELECT $1, now() - g * interval '1 second', 'manual', 'echo', 1 "
            "FROM generate_series(1, 3000) g",
            sid,
        )
        before = await _gc_collections(service)
        await pool.execute("SELECT pg_notify('promptsched_runs', 'test')")
        await wait_until(lambda: runs_settled(pool), timeout=60, what="3,000 runs to finish")
        after = await _gc_collections(service)
    finally:
        service.stop()
    assert after["0"] - before["0"] < 20, (before, after)
    assert (after["1"], after["2"]) == (before["1"], before["2"]), (before, after)
