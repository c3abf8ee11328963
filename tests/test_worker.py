"""Worker and reaper against real Postgres, time moved by a frozen clock (no sleeping)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import uuid4

import anyio
import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.config import ReaperSettings
from promptsched.metrics import FENCED_WRITE_KINDS, Metrics
from promptsched.roles.reaper import Reaper
from promptsched.store import queries
from tests import factories
from tests.factories import EPOCH, attempt_statuses, run_row
from tests.helpers import wait_until


async def test_a_pending_run_is_claimed_executed_and_succeeds(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    sid = await factories.schedule(pool, prompt="weekly report")
    rid = await factories.pending_run(pool, sid)
    assert await factories.worker_pool(pool, clock).run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["output"], run["attempts"]) == (
        "succeeded",
        "echo: weekly report",
        1,
    )
    assert run["lease_expires_at"] is None and run["finished_at"] == EPOCH
    assert await attempt_statuses(pool, rid) == ["succeeded"]


async def test_a_run_not_yet_available_is_not_claimed(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH - timedelta(seconds=1))
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    assert await factories.worker_pool(pool, clock).run_once() == 0
    assert (await run_row(pool, rid))["status"] == "pending"


async def test_failures_retry_with_backoff_then_succeed(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    sid = await factories.schedule(pool, params={"fail_attempts": 2}, max_attempts=3)
    rid = await factories.pending_run(pool, sid)
    workers = factories.worker_pool(pool, clock, metrics)
    delays = []
    for attempt in (1, 2):
        assert await workers.run_once() == 1
        run = await run_row(pool, rid)
        assert run["status"] == "pending" and run["attempts"] == attempt
        assert "injected failure" in run["error"]
        delay = run["available_at"] - clock.instant
        delays.append(delay)
        # Not claimable before its backoff has passed.
        assert await workers.run_once() == 0
        clock.advance(delay)
    # Exponential backoff with equal jitter: base 10s, so [5s, 10s] then [10s, 20s].
    assert timedelta(seconds=5) <= delays[0] <= timedelta(seconds=10)
    assert timedelta(seconds=10) <= delays[1] <= timedelta(seconds=20)
    assert await workers.run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"], run["error"]) == ("succeeded", 3, None)
    assert await attempt_statuses(pool, rid) == ["failed", "failed", "succeeded"]
    assert metrics.retries.labels("echo")._value.get() == 2


async def test_retries_exhausted_go_dead_with_the_last_error(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    sid = await factories.schedule(pool, params={"fail_attempts": 9}, max_attempts=2)
    rid = await factories.pending_run(pool, sid)
    workers = factories.worker_pool(pool, clock, metrics)
    await workers.run_once()
    clock.advance(timedelta(minutes=10))
    await workers.run_once()
    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("dead", 2)
    assert run["error"] == "echo: injected failure on attempt 2"
    assert metrics.dead_letters.labels("echo")._value.get() == 1


async def test_a_permanent_error_goes_dead_at_once(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    sid = await factories.schedule(
        pool, params={"fail_attempts": 1, "fail_permanent": "true"}, max_attempts=5
    )
    rid = await factories.pending_run(pool, sid)
    await factories.worker_pool(pool, clock).run_once()
    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("dead", 1)


async def test_a_schedule_disabled_before_the_claim_skips_its_run(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    sid = await factories.schedule(pool)
    rid = await factories.pending_run(pool, sid)
    await pool.execute("UPDATE schedules SET enabled = false WHERE id = $1", sid)
    await factories.worker_pool(pool, clock).run_once()
    run = await run_row(pool, rid)
    assert (run["status"], run["skip_reason"]) == ("skipped", "disabled")


async def test_an_attempt_past_its_timeout_fails_and_retries(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    sid = await factories.schedule(
        pool, params={"latency": "30s"}, timeout=timedelta(seconds=1), max_attempts=2
    )
    rid = await factories.pending_run(pool, sid)
    await factories.worker_pool(pool, clock).run_once()
    run = await run_row(pool, rid)
    assert (run["status"], run["error"]) == ("pending", "timed out after 1s")


async def test_a_stale_attempt_writes_nothing(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    [claimed] = await queries.run_claim_batch(pool, None, "echo", 1, "w", timedelta(seconds=30))
    stale = uuid4()
    landed = await queries.run_finish_many(
        pool,
        clock.sql_now(),
        [queries.Finish(rid, stale, "succeeded", "succeeded", output="from a stale attempt")],
        "w",
    )
    assert landed == set()
    run = await run_row(pool, rid)
    assert (run["status"], run["output"], run["attempt_id"]) == (
        "running",
        None,
        claimed.attempt_id,
    )


async def test_the_reaper_requeues_an_expired_lease_and_marks_the_attempt_lost(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    rid = await factories.pending_run(pool, await factories.schedule(pool, max_attempts=2))
    await queries.run_claim_batch(pool, clock.sql_now(), "echo", 1, "w", timedelta(seconds=30))
    reaper = Reaper(pool, clock, metrics, ReaperSettings(deadline_grace=timedelta(seconds=30)))
    assert sum((await reaper.run_once()).values()) == 0  # lease still valid
    clock.advance(timedelta(seconds=31))
    assert (await reaper.run_once())["pending"] == 1
    run = await run_row(pool, rid)
    assert run["status"] == "pending" and "lease expired" in run["error"]
    assert await attempt_statuses(pool, rid) == ["lost"]
    # The second loss uses up max_attempts=2: dead.
    await queries.run_claim_batch(pool, clock.sql_now(), "echo", 1, "w", timedelta(seconds=30))
    clock.advance(timedelta(seconds=31))
    assert (await reaper.run_once())["dead"] == 1
    assert (await run_row(pool, rid))["status"] == "dead"
    assert await attempt_statuses(pool, rid) == ["lost", "lost"]
    assert metrics.leases_reaped.labels("dead")._value.get() == 1


async def test_a_lease_renewed_past_the_deadline_ends_one_lease_after_it(
    pool: asyncpg.Pool[Any],
) -> None:
    """The reaper's backstop for a worker that does not stop an attempt at its timeout: its
    heartbeats renew the lease only up to the deadline plus one lease, the reaper (which reads
    leases only) then takes the run back, and says it timed out rather than that it was lost."""
    clock = FrozenClock(EPOCH)
    lease = timedelta(seconds=30)
    rid = await factories.pending_run(
        pool, await factories.schedule(pool, timeout=timedelta(seconds=60))
    )
    [claimed] = await queries.run_claim_batch(pool, clock.sql_now(), "echo", 1, "w", lease)
    reaper = Reaper(pool, clock, Metrics(), ReaperSettings(deadline_grace=lease))
    for _ in range(4):  # still renewing at +80 s, 20 s past the deadline
        clock.advance(timedelta(seconds=20))
        assert sum((await reaper.run_once()).values()) == 0
        renewed = await queries.run_heartbeat_many(
            pool, clock.sql_now(), [rid], [claimed.attempt_id], lease
        )
        assert [row["id"] for row in renewed] == [rid]
    run = await run_row(pool, rid)
    assert run["lease_expires_at"] == run["deadline_at"] + lease == EPOCH + timedelta(seconds=90)
    clock.advance(timedelta(seconds=11))
    assert (await reaper.run_once())["pending"] == 1
    run = await run_row(pool, rid)
    assert run["status"] == "pending"
    assert run["error"] == "timed out: the worker did not stop the attempt"
    assert [row["error"] for row in await factories.attempt_rows(pool, rid)] == ["deadline passed"]


async def test_serial_runs_of_one_schedule_start_one_at_a_time(pool: asyncpg.Pool[Any]) -> None:
    clock = FrozenClock(EPOCH)
    sid = await factories.schedule(pool, overlap="buffer_all")
    first = await factories.pending_run(pool, sid, EPOCH - timedelta(minutes=2))
    await factories.pending_run(pool, sid, EPOCH - timedelta(minutes=1))
    await pool.execute("UPDATE runs SET serial = true WHERE schedule_id = $1", sid)
    claimed = await queries.run_claim_batch(
        pool, clock.sql_now(), "echo", 10, "w", timedelta(seconds=30)
    )
    assert [row.id for row in claimed] == [first]
    # While the first runs, a second claimer gets nothing of this schedule.
    again = await queries.run_claim_batch(
        pool, clock.sql_now(), "echo", 10, "w2", timedelta(seconds=30)
    )
    assert again == []


async def test_retention_purges_only_old_finished_runs(pool: asyncpg.Pool[Any]) -> None:
    from promptsched.roles.retention import Retention

    clock = FrozenClock(EPOCH)
    sid = await factories.schedule(pool)
    for days_ago, status in ((40, "succeeded"), (31, "dead"), (29, "succeeded"), (40, "pending")):
        await pool.execute(
            "INSERT INTO runs (schedule_id, slot, provider, max_attempts, status, finished_at) "
            "VALUES ($1, $2::timestamptz, 'echo', 3, $3::text, "
            "CASE WHEN $3::text = 'pending' THEN NULL ELSE $2::timestamptz END)",
            sid,
            EPOCH - timedelta(days=days_ago, minutes=len(status)),
            status,
        )
    retention = Retention(pool, clock, Metrics(), retention=timedelta(days=30), batch=1)
    assert [await retention.run_once() for _ in range(3)] == [1, 1, 0]
    left = await pool.fetch("SELECT status FROM runs ORDER BY slot")
    # The 29-day-old run and the unfinished one stay.
    assert sorted(r["status"] for r in left) == ["pending", "succeeded"]


async def test_a_cancel_requested_run_whose_worker_died_ends_cancelled(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    rid = await factories.pending_run(pool, await factories.schedule(pool, max_attempts=5))
    await queries.run_claim_batch(pool, clock.sql_now(), "echo", 1, "w", timedelta(seconds=30))
    await pool.execute("UPDATE runs SET cancel_requested = true WHERE id = $1", rid)
    clock.advance(timedelta(seconds=31))
    counts = await Reaper(
        pool, clock, Metrics(), ReaperSettings(deadline_grace=timedelta(seconds=30))
    ).run_once()
    assert counts["cancelled"] == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["cancel_requested"]) == ("cancelled", False)
    assert run["finished_at"] == clock.instant


async def _statuses(pool: asyncpg.Pool[Any]) -> dict[str, int]:
    rows = await pool.fetch("SELECT status, count(*)::int FROM runs GROUP BY status")
    return {row["status"]: row["count"] for row in rows}


async def test_attempts_finishing_together_share_one_final_write(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await factories.schedule(pool)
    for second in range(12):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=second))
    finish_many = queries.run_finish_many
    batches: list[int] = []

    async def counted(db: Any, now: Any, batch: Any, worker_id: str) -> set[int]:
        batches.append(len(batch))
        return await finish_many(db, now, batch, worker_id)

    monkeypatch.setattr(queries, "run_finish_many", counted)
    assert await factories.worker_pool(pool, FrozenClock(EPOCH), slots=12).run_once() == 12
    assert batches == [12]  # one statement for the twelve attempts of one claim
    assert await _statuses(pool) == {"succeeded": 12}
    attempts = await pool.fetch("SELECT DISTINCT status FROM run_attempts")
    assert [row["status"] for row in attempts] == ["succeeded"]


@pytest.mark.parametrize("max_batch", [256, 2], ids=["batch-not-full", "batch-full"])
async def test_the_next_claim_overlaps_a_final_write_within_a_bound(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch, max_batch: int
) -> None:
    # Two slots. Final writes are held: the first pair's slots are free already, so the next
    # pair is claimed and run meanwhile; then no more (queued writes are bounded to one slot
    # count), and nothing is lost when the writes go through. The next pair's write waits
    # behind the first unless it fills a batch: only then does the second writer take it.
    sid = await factories.schedule(pool)
    for second in range(6):
        await factories.pending_run(pool, sid, EPOCH - timedelta(seconds=second))
    finish_many = queries.run_finish_many
    gate = anyio.Event()
    held: list[int] = []

    async def held_writes(db: Any, now: Any, batch: Any, worker_id: str) -> set[int]:
        held.append(len(batch))
        await gate.wait()
        return await finish_many(db, now, batch, worker_id)

    monkeypatch.setattr(queries, "run_finish_many", held_writes)
    workers = factories.worker_pool(pool, FrozenClock(EPOCH), slots=2)
    workers.finalizer.max_batch = max_batch
    claimed: list[int] = []
    claim_batch = queries.run_claim_batch

    async def recorded(*args: Any) -> Any:
        rows = await claim_batch(*args)
        claimed.append(len(rows))
        return rows

    monkeypatch.setattr(queries, "run_claim_batch", recorded)
    async with anyio.create_task_group() as tg:

        async def drain() -> None:
            assert await workers.run_once() == 6

        tg.start_soon(drain)

        async def both_pairs_writing() -> bool:
            if max_batch == 2:
                return held == [2, 2] and workers.finalizer.pending == 0
            return held == [2] and workers.finalizer.pending == 2

        await wait_until(both_pairs_writing, timeout=10, what="both pairs' writes held")
        assert claimed == [2, 2] and (await _statuses(pool)).get("running") == 4
        assert len(workers.inflight) == 4  # both pairs keep their leases (heartbeats go on)
        gate.set()
    assert await _statuses(pool) == {"succeeded": 6}
    assert sum(claimed) == 6


async def test_drain_lets_a_queued_final_write_land_instead_of_releasing_it(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    finish_many = queries.run_finish_many
    writing = anyio.Event()
    gate = anyio.Event()

    async def held(db: Any, now: Any, batch: Any, worker_id: str) -> set[int]:
        writing.set()
        await gate.wait()
        return await finish_many(db, now, batch, worker_id)

    monkeypatch.setattr(queries, "run_finish_many", held)
    metrics = Metrics()
    workers = factories.worker_pool(pool, FrozenClock(EPOCH), metrics)
    async with anyio.create_task_group() as tg:
        await tg.start(workers.run)
        workers.notify()
        with anyio.fail_after(10):
            await writing.wait()
        async with anyio.create_task_group() as stopping:

            async def drain() -> None:
                assert await workers.drain(timedelta(0)) == 0  # nothing released

            stopping.start_soon(drain)
            gate.set()
        tg.cancel_scope.cancel()
    run = await run_row(pool, rid)
    assert (run["status"], run["releases"]) == ("succeeded", 0)
    assert await attempt_statuses(pool, rid) == ["succeeded"]
    assert metrics.leases_released._value.get() == 0
    for kind in FENCED_WRITE_KINDS:
        assert metrics.fenced_writes.labels(kind)._value.get() == 0, kind
