"""Fair to every owner (docs/reliability.md): one owner's backlog never starves another's due
runs. The claim interleaves owners; a real service with one owner's rush and another owner's
per-second schedule starts every slot of the second within a second."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched.store import queries
from tests import factories
from tests.factories import EPOCH
from tests.helpers import Service, wait_until

LEASE = timedelta(seconds=30)


async def _owned_schedule(pool: asyncpg.Pool[Any], owner: str, **fields: Any) -> int:
    sid = await factories.schedule(pool, name=owner, **fields)
    await pool.execute("UPDATE schedules SET owner = $2 WHERE id = $1", sid, owner)
    return sid


async def _backlog(pool: asyncpg.Pool[Any], sid: int, count: int, first: timedelta) -> None:
    """``count`` pending runs of schedule ``sid``, one a second from ``EPOCH + first``, carrying
    the schedule's owner as every writer of runs does."""
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at, owner) "
        "SELECT s.id, $2::timestamptz + g * interval '1 second', 'cadence', s.provider, 3, "
        "       $2::timestamptz + g * interval '1 second', s.owner "
        "FROM schedules s, generate_series(0, $3::int - 1) g WHERE s.id = $1",
        sid, EPOCH + first, count,
    )  # fmt: skip


async def _claimed_owners(claim: queries.Claim, pool: asyncpg.Pool[Any]) -> list[str]:
    rows = await pool.fetch(
        "SELECT r.owner FROM runs r WHERE r.id = ANY ($1::bigint[]) ORDER BY r.id",
        [row.id for row in claim],
    )
    return [row["owner"] for row in rows]


async def test_a_claim_takes_every_waiting_owners_first_run_before_a_backlog(
    pool: asyncpg.Pool[Any],
) -> None:
    rush = await _owned_schedule(pool, "rush")
    quiet = await _owned_schedule(pool, "quiet")
    other = await _owned_schedule(pool, "other")
    await _backlog(pool, rush, 300, timedelta(0))  # due first, all of them
    await _backlog(pool, quiet, 1, timedelta(minutes=10))  # due well after the whole backlog
    await _backlog(pool, other, 2, timedelta(minutes=20))
    now = EPOCH + timedelta(hours=1)
    claim = await queries.run_claim_batch(pool, now, "echo", 8, "w", LEASE)
    owners = await _claimed_owners(claim, pool)
    # Round-robin: each owner's first, then each one's second, then the backlog's.
    assert sorted(owners) == sorted(["rush"] * 5 + ["quiet"] + ["other"] * 2)
    # Nothing else stays locked or claimed: the lanes it read and did not take are pending.
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'running'") == 8


async def test_with_one_owner_waiting_the_claim_takes_its_runs_in_order(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await _owned_schedule(pool, "alone")
    await _backlog(pool, sid, 50, timedelta(0))
    claim = await queries.run_claim_batch(pool, EPOCH + timedelta(hours=1), "echo", 8, "w", LEASE)
    slots = [row.slot for row in claim]
    assert sorted(slots) == [EPOCH + timedelta(seconds=s) for s in range(8)]


async def test_a_fleet_limited_claim_interleaves_owners_within_what_the_limit_allows(
    pool: asyncpg.Pool[Any],
) -> None:
    rush = await _owned_schedule(pool, "rush")
    quiet = await _owned_schedule(pool, "quiet")
    await _backlog(pool, rush, 100, timedelta(0))
    await _backlog(pool, quiet, 1, timedelta(minutes=5))
    claim = await queries.run_claim_limited(
        pool, EPOCH + timedelta(hours=1), "echo", 16, "w", LEASE,
        max_concurrency=3, rate=None, burst=1.0,
    )  # fmt: skip
    assert claim.room.allowed == 3
    assert sorted(await _claimed_owners(claim, pool)) == ["quiet", "rush", "rush"]
    # The limit is reached: the next claim takes nothing, from either lane.
    again = await queries.run_claim_limited(
        pool, EPOCH + timedelta(hours=1), "echo", 16, "w", LEASE,
        max_concurrency=3, rate=None, burst=1.0,
    )  # fmt: skip
    assert len(again) == 0


# --- the acceptance case, with a real service --------------------------------------------

# One owner's rush against another owner's per-second schedule, on one provider. Scaled from
# the report (10,000 schedules firing each minute against an every-5-seconds schedule: 12 of
# its slots per rush) to RUSH schedules firing every PERIOD against an every-second schedule
# (10 of its slots per rush); each run takes LATENCY in one of SLOTS worker slots, so a rush
# is a backlog of RUSH / (SLOTS / LATENCY) = 7.5 s of the period's 10. Without the claim's
# lanes, the every-second schedule's runs waited 7.9 s and lost 16 of its 20 slots to overlap.
RUSH = int(os.environ.get("PROMPTSCHED_TEST_FAIR_RUSH", "1000"))
PERIOD = int(os.environ.get("PROMPTSCHED_TEST_FAIR_PERIOD", "10"))
EVERY = int(os.environ.get("PROMPTSCHED_TEST_FAIR_EVERY", "1"))
SLOTS = 20
LATENCY = os.environ.get("PROMPTSCHED_TEST_FAIR_LATENCY", "150ms")
RUSHES = 2


@pytest.mark.slow
async def test_a_rush_of_one_owner_never_delays_another_owners_every_second_schedule(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    service = Service(dsn, tmp_path / "service.log", env={"PROMPTSCHED_WORKERS": str(SLOTS)})
    try:
        await service.ready()
        start = await pool.fetchval(
            "SELECT to_timestamp(ceil(extract(epoch FROM now() + interval '3 seconds') / $1) * $1)",
            EVERY,
        )  # fmt: skip
        anchor = start.isoformat().replace("+00:00", "Z")
        await pool.execute(
            "INSERT INTO schedules (owner, name, kind, expression, prompt, params, next_fire_at) "
            "SELECT 'rush', 'rush-' || g, 'every', $2, 'hello', $3::jsonb, $4 "
            "FROM generate_series(1, $1) g",
            RUSH, f"{PERIOD}s from {anchor}", {"latency": LATENCY}, start,
        )  # fmt: skip
        victim = await _owned_schedule(
            pool, "victim", kind="every", expression=f"{EVERY}s", next_fire_at=start,
            params={"latency": LATENCY},
        )  # fmt: skip
        await queries.schedule_notify_changed(pool, victim)
        end = start + timedelta(seconds=RUSHES * PERIOD)

        async def window_over() -> bool:
            done = await pool.fetchval(
                "SELECT count(*) FROM runs WHERE schedule_id = $1 AND slot < $2 "
                "AND (started_at IS NOT NULL OR status = 'skipped')",
                victim, end,
            )  # fmt: skip
            return bool(done >= RUSHES * PERIOD // EVERY)

        await wait_until(window_over, timeout=RUSHES * PERIOD + 20, what="the window's slots")
        rushed = await pool.fetchval(
            "SELECT count(*) FROM runs r JOIN schedules s ON s.id = r.schedule_id "
            "WHERE s.owner = 'rush' AND r.slot < $1",
            end,
        )
    finally:
        service.stop()
    rows = await pool.fetch(
        "SELECT slot, status, skip_reason, "
        "       extract(epoch FROM created_at - slot)::float8 AS tick_lag, "
        "       extract(epoch FROM started_at - slot)::float8 AS start_lag "
        "FROM runs WHERE schedule_id = $1 AND slot >= $2 AND slot < $3 ORDER BY slot",
        victim, start, end,
    )  # fmt: skip
    # The rushes were real: every rush slot of the window became a run row.
    assert rushed == RUSHES * RUSH
    summary = [(r["slot"].second, r["status"], r["tick_lag"], r["start_lag"]) for r in rows]
    every = [start + timedelta(seconds=s * EVERY) for s in range(RUSHES * PERIOD // EVERY)]
    assert [r["slot"] for r in rows] == every, summary
    print("slot, status, tick lag, start lag:", summary)  # shown with -s
    assert not [r for r in rows if r["status"] == "skipped"], summary  # no slot lost
    assert max(r["start_lag"] for r in rows) < 1.0, summary
