"""The running runs of each provider, kept as counters by triggers on `runs` (migration 0027):
every way into and out of `running` moves them, so a limited claim reads a few counter rows
instead of counting the runs in flight, and the count it reads is the real one."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg

from promptsched.clock import FrozenClock
from promptsched.config import ReaperSettings
from promptsched.domain import RunStatus
from promptsched.metrics import Metrics
from promptsched.roles.reaper import Reaper
from promptsched.store import queries
from tests import factories
from tests.factories import EPOCH

LEASE = timedelta(seconds=30)
ZERO = timedelta(0)


async def _counted(pool: asyncpg.Pool[Any]) -> dict[str, tuple[int, int]]:
    """Per provider: (what the counters say, how many runs are running)."""
    rows = await pool.fetch(
        "SELECT p.provider, provider_running_count(p.provider) AS counted, "
        "(SELECT count(*) FROM runs r WHERE r.provider = p.provider "
        " AND r.status = 'running')::int AS running "
        "FROM (SELECT DISTINCT provider FROM runs UNION SELECT provider FROM provider_running) p"
    )
    return {row["provider"]: (row["counted"], row["running"]) for row in rows}


async def _agree(pool: asyncpg.Pool[Any], **expected: int) -> None:
    counted = await _counted(pool)
    assert all(c == r for c, r in counted.values()), counted
    assert {p: r for p, (_, r) in counted.items() if r or p in expected} == expected


async def _schedule_with_runs(pool: asyncpg.Pool[Any], provider: str, runs: int) -> int:
    sid = await factories.schedule(pool, max_attempts=5)
    await pool.execute("UPDATE schedules SET provider = $2 WHERE id = $1", sid, provider)
    for n in range(runs):
        await factories.pending_run(pool, sid, EPOCH - timedelta(minutes=n), origin="manual")
    return sid


def _finish(run: Any, status: RunStatus) -> queries.Finish:
    if status is RunStatus.PENDING:  # a retry, claimable again at once
        return queries.Finish(run.id, run.attempt_id, status, "failed", error="e", retry_in=ZERO)
    if status is RunStatus.SKIPPED:
        return queries.Finish(run.id, run.attempt_id, status, "skipped", skip_reason="disabled")
    return queries.Finish(run.id, run.attempt_id, status, str(status), output="ok")


async def test_every_way_into_and_out_of_running_moves_the_count(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    doomed = await _schedule_with_runs(pool, "llm", 3)
    await _schedule_with_runs(pool, "llm", 20)
    await _schedule_with_runs(pool, "other", 4)
    # Two workers claim, one through the fleet-limited claim.
    first = await queries.run_claim_batch(pool, clock.sql_now(), "llm", 8, "w1", LEASE)
    await queries.run_claim_batch(pool, clock.sql_now(), "other", 4, "w1", LEASE)
    # A renewal changes nothing.
    clock.advance(timedelta(seconds=5))
    renewed = await queries.run_heartbeat_many(
        pool, clock.sql_now(), [r.id for r in first], [r.attempt_id for r in first], LEASE
    )
    assert len(renewed) == 8
    await _agree(pool, llm=8, other=4)
    clock.advance(timedelta(seconds=15))
    second = await queries.run_claim_limited(
        pool, clock.sql_now(), "llm", 6, "w2", LEASE, max_concurrency=100, rate=None, burst=1
    )
    assert second.room.running == 8  # what the limited claim saw: the first worker's 8
    await _agree(pool, llm=14, other=4)
    # A success, a retry and a skip each end one.
    statuses = (RunStatus.SUCCEEDED, RunStatus.PENDING, RunStatus.SKIPPED)
    landed = await queries.run_finish_many(
        pool, clock.sql_now(), [_finish(r, s) for r, s in zip(first, statuses, strict=False)], "w1"
    )
    assert len(landed) == 3
    await _agree(pool, llm=11, other=4)
    # A stale finish changes nothing (fenced), nor does the count.
    assert not await queries.run_finish_many(
        pool, clock.sql_now(), [_finish(first[0], RunStatus.SUCCEEDED)], "w1"
    )
    await _agree(pool, llm=11, other=4)
    # The drain hands runs back.
    released = second[:2]
    assert await queries.run_release_many(
        pool, clock.sql_now(), [r.id for r in released], [r.attempt_id for r in released], "w2"
    ) == 2  # fmt: skip
    await _agree(pool, llm=9, other=4)
    # The reaper takes back the expired leases (w1's renewed at +5 s, and "other"), not w2's.
    clock.advance(timedelta(seconds=16))
    reaped = await Reaper(pool, clock, Metrics(), ReaperSettings(deadline_grace=LEASE)).run_once()
    assert sum(reaped.values()) == 5 + 4
    await _agree(pool, llm=4, other=0)
    # A schedule deleted with its runs running, and rows written by hand.
    await queries.run_claim_batch(pool, clock.sql_now(), "llm", 30, "w3", LEASE)
    await _agree(pool, llm=21)  # every llm run but the success and the skip
    assert await queries.schedule_delete(pool, doomed, None)
    await _agree(pool, llm=21 - 3)
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, provider, max_attempts, status, attempt_id, "
        "lease_expires_at) SELECT id, now(), 'other', 1, 'running', gen_random_uuid(), now() "
        "FROM schedules LIMIT 1"
    )
    await _agree(pool, llm=18, other=1)
    await pool.execute("DELETE FROM runs WHERE provider = 'other' AND status = 'running'")
    await _agree(pool, llm=18, other=0)
    await pool.execute("TRUNCATE runs CASCADE")
    await _agree(pool)


async def test_concurrent_claims_and_finishes_keep_the_count(pool: asyncpg.Pool[Any]) -> None:
    """Four workers claim and finish at once, on their own connections, in batches: the count
    stays the real one (and no two counter writes deadlock)."""
    await _schedule_with_runs(pool, "llm", 400)

    async def work(worker: str) -> None:
        while claimed := await queries.run_claim_limited(
            pool, None, "llm", 7, worker, LEASE, max_concurrency=1000, rate=None, burst=1
        ):
            statuses = [RunStatus.SUCCEEDED, RunStatus.PENDING] * 4
            done = [
                _finish(r, s) for r, s in zip(claimed, statuses, strict=False) if r.attempts < 3
            ]
            await queries.run_finish_many(pool, None, done, worker)

    await asyncio.gather(*(work(f"w{n}") for n in range(4)))
    counted, running = (await _counted(pool))["llm"]
    assert counted == running > 0  # the runs left running (third attempts) are counted


async def test_a_claim_counts_out_only_its_own_returned_calls_still_running(
    pool: asyncpg.Pool[Any],
) -> None:
    """A limited claim counts calls in flight: it passes its process's runs whose call has
    returned (their final write on its way) and provider_admit counts out those still
    running with the attempt passed, by key; a run whose write committed, one claimed again
    since (another attempt), or one of another provider is not counted out."""
    clock = FrozenClock(EPOCH)
    await _schedule_with_runs(pool, "llm", 6)
    await _schedule_with_runs(pool, "other", 1)
    llm = await queries.run_claim_batch(pool, clock.sql_now(), "llm", 6, "w1", LEASE)
    other = await queries.run_claim_batch(pool, clock.sql_now(), "other", 1, "w1", LEASE)
    written, retried, returned = llm[0], llm[1], llm[2:4]
    assert await queries.run_finish_many(
        pool, clock.sql_now(),
        [_finish(written, RunStatus.SUCCEEDED), _finish(retried, RunStatus.PENDING)], "w1",
    )  # fmt: skip
    again = await queries.run_claim_batch(pool, clock.sql_now(), "llm", 1, "w2", LEASE)
    assert [r.id for r in again] == [retried.id]  # the retry, claimed with a new attempt
    await _schedule_with_runs(pool, "llm", 4)  # waiting to be claimed

    async def claim(passed: list[Any], want: int) -> queries.LimitedClaim:
        claimed = await queries.run_claim_limited(
            pool, clock.sql_now(), "llm", want, "w1", LEASE, max_concurrency=5, rate=None,
            burst=1, returned=[r.id for r in passed],
            returned_attempts=[r.attempt_id for r in passed],
        )  # fmt: skip
        assert isinstance(claimed, queries.LimitedClaim)
        return claimed

    # 5 llm runs are running (4 of w1's first claim, the retry again): the limit is full.
    nothing = await claim([written, retried, *other], 2)
    assert (nothing.room.running, len(nothing)) == (5, 0)
    # Two of them returned their call: two calls in flight less, two places free.
    two = await claim([written, retried, *returned, *other], 5)
    assert (two.room.running, len(two)) == (3, 2)
    await _agree(pool, llm=7, other=1)  # the counters still count every running run
