"""Misfire and overlap policies with a real service process and real time."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched.clock import Clock
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from tests.factories import runs_settled
from tests.helpers import Service, wait_until

pytestmark = pytest.mark.slow


_NAMES = itertools.count(1)


async def _create(pool: asyncpg.Pool[Any], **raw: Any) -> int:
    named = {"name": f"live {next(_NAMES)}", "prompt": "p"}  # names are unique per owner
    values = inputs.validate({**named, **raw}, providers=["echo"])
    return (await schedule_ops.create_schedule(pool, Clock(), values, owner="o")).id


async def _db_now(pool: asyncpg.Pool[Any]) -> Any:
    return await pool.fetchval("SELECT now()")


async def _settle(pool: asyncpg.Pool[Any], ids: list[int]) -> None:
    # End the cadence (no cursor) without disabling: disabling would skip queued runs.
    await pool.execute("UPDATE schedules SET next_fire_at = NULL WHERE id = ANY($1)", ids)

    await wait_until(lambda: runs_settled(pool), timeout=30, what="every run to finish")


async def test_misfire_policies_after_the_service_was_down(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    common = {"cron": "* * * * * *", "misfire_grace": "500ms", "overlap": "allow"}
    ids = {
        policy: await _create(pool, misfire=policy, misfire_cap=2, **common)
        for policy in ("run_once", "skip", "run_all")
    }
    first = Service(dsn, tmp_path / "a.log")
    try:
        await first.ready()

        async def ticked() -> bool:
            return bool(await pool.fetchval("SELECT count(*) >= 6 FROM runs"))

        await wait_until(ticked, timeout=15, what="a few on-time ticks")
    finally:
        first.stop()
    down_since = await _db_now(pool)

    async def five_slots_missed() -> bool:
        return bool(await _db_now(pool) >= down_since + timedelta(seconds=5))

    await wait_until(five_slots_missed, timeout=10, what="five seconds of downtime")
    second = Service(dsn, tmp_path / "b.log")
    try:
        await second.ready()
        await second.wait_event("scheduler.ticked", timeout=15)
        await _settle(pool, list(ids.values()))
    finally:
        second.stop()
    for policy, sid in ids.items():
        rows = await pool.fetch(
            "SELECT slot, status, skip_reason, missed_slots FROM runs WHERE schedule_id = $1 "
            "AND slot > $2 ORDER BY slot",
            sid,
            down_since,
        )
        late = [r for r in rows if r["skip_reason"] == "misfire" or r["missed_slots"] > 0]
        covered = sum(1 + r["missed_slots"] for r in rows if r["slot"] <= rows[-1]["slot"])
        # Every slot of the downtime is accounted for: run, or counted in a coalesced row.
        assert covered >= 5, (policy, rows)
        if policy == "skip":
            assert [r["status"] for r in late] == ["skipped"] and late[0]["missed_slots"] >= 4
        if policy == "run_once":
            assert len(late) == 1 and late[0]["missed_slots"] >= 4
        if policy == "run_all":
            # Capped at 2 runs; the rest coalesced into one skipped row.
            assert [r["status"] for r in late] == ["skipped"]
        assert {r["status"] for r in rows} <= {"succeeded", "skipped"}


async def test_overlap_policies_when_a_run_outlasts_its_interval(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    policies = ("skip", "allow", "buffer_one", "buffer_all", "cancel_other")
    ids = {
        p: await _create(pool, cron="* * * * * *", overlap=p, params={"latency": "1500ms"})
        for p in policies
    }
    live = Service(dsn, tmp_path / "svc.log", env={"PROMPTSCHED_WORKERS": "16"})
    try:
        await live.ready()

        async def long_enough() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) >= 4 FROM runs WHERE schedule_id = $1", ids["allow"]
                )
            )

        await wait_until(long_enough, timeout=20, what="five slots")
        await _settle(pool, list(ids.values()))
    finally:
        live.stop()

    async def runs(policy: str) -> list[asyncpg.Record]:
        return await pool.fetch(
            "SELECT r.status, r.skip_reason, a.started_at, a.finished_at FROM runs r "
            "LEFT JOIN run_attempts a ON a.run_id = r.id WHERE r.schedule_id = $1 "
            "ORDER BY r.slot",
            ids[policy],
        )

    def overlapping(rows: list[asyncpg.Record]) -> bool:
        spans = sorted((r["started_at"], r["finished_at"]) for r in rows if r["started_at"])
        return any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))

    skip = await runs("skip")
    assert {r["skip_reason"] for r in skip if r["status"] == "skipped"} == {"overlap"}
    assert not overlapping(skip) and sum(r["status"] == "skipped" for r in skip) >= 1
    allow = await runs("allow")
    assert overlapping(allow) and {r["status"] for r in allow} == {"succeeded"}
    buffer_one = await runs("buffer_one")
    assert not overlapping(buffer_one)
    assert any(r["status"] == "skipped" for r in buffer_one)
    buffer_all = await runs("buffer_all")
    assert not overlapping(buffer_all) and {r["status"] for r in buffer_all} == {"succeeded"}
    cancel_other = await runs("cancel_other")
    assert any(r["status"] == "cancelled" for r in cancel_other)
