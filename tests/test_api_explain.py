"""GET /v1/schedules/{id}/explain: "why didn't it run on Monday?" answered from the schedule,
its history and its runs, with a frozen clock and rows that are already old."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.metrics import Metrics
from promptsched.roles.retention import Retention
from tests import api_support
from tests.api_support import SCHEDULE, Api

MONDAY = datetime.fromisoformat("2026-03-02T09:00:00+00:00")
NOW = MONDAY + timedelta(days=7, hours=3)
DAY = timedelta(days=1)


@pytest.fixture
async def api(pool: asyncpg.Pool[Any]) -> AsyncIterator[Api]:
    async with api_support.client(pool, clock=FrozenClock(NOW)) as client:
        yield client


async def _schedule(api: Api, who: dict[str, str], pool: asyncpg.Pool[Any], **fields: Any) -> int:
    """A daily 09:00 schedule that has existed since the Friday before MONDAY."""
    sid = (await api.post("/v1/schedules", who, json={**SCHEDULE, **fields})).body["id"]
    await pool.execute("UPDATE schedules SET created_at = $2 WHERE id = $1", sid, MONDAY - 3 * DAY)
    await pool.execute(
        "UPDATE schedule_changes SET at = $2 WHERE schedule_id = $1", sid, MONDAY - 3 * DAY
    )
    return int(sid)


async def _run(pool: asyncpg.Pool[Any], sid: int, slot: datetime, status: str, **extra: Any) -> int:
    rid: int = await pool.fetchval(
        "INSERT INTO runs (schedule_id, slot, status, skip_reason, missed_slots, provider, "
        "max_attempts, attempts, error, finished_at) "
        "VALUES ($1, $2, $3, $4, $5, 'echo', 3, $6, $7, "
        "CASE WHEN $3 IN ('pending', 'running') THEN NULL ELSE $2::timestamptz END) RETURNING id",
        sid, slot, status, extra.get("skip_reason"), extra.get("missed_slots", 0),
        extra.get("attempts", 1), extra.get("error"),
    )  # fmt: skip
    return rid


async def _change(
    pool: asyncpg.Pool[Any], sid: int, at: datetime, action: str, changes: dict[str, Any]
) -> None:
    await pool.execute(
        "INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes, at) "
        "VALUES ($1, 'alice', 'alice', $2, $3, $4)",
        sid, action, changes, at,
    )  # fmt: skip


async def _explain(api: Api, who: dict[str, str], sid: int, at: str) -> dict[str, Any]:
    reply = await api.get(f"/v1/schedules/{sid}/explain", who, params={"at": at})
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


async def test_a_slot_that_ran_failed_or_was_skipped(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(api, alice, pool)
    ran = await _run(pool, sid, MONDAY, "succeeded")
    await _run(pool, sid, MONDAY + DAY, "dead", attempts=3, error="HTTP 500 from the provider")
    await _run(pool, sid, MONDAY + 2 * DAY, "skipped", skip_reason="overlap")

    monday = await _explain(api, alice, sid, MONDAY.isoformat())
    assert (monday["verdict"], monday["fire_time"]) == ("ran", True)
    assert [r["id"] for r in monday["runs"]] == [ran]
    assert monday["previous_fire_time"] == (MONDAY - DAY).isoformat()
    assert monday["next_fire_time"] == (MONDAY + DAY).isoformat()
    tuesday = await _explain(api, alice, sid, (MONDAY + DAY).isoformat())
    assert tuesday["verdict"] == "failed" and "HTTP 500" in tuesday["message"]
    wednesday = await _explain(api, alice, sid, (MONDAY + 2 * DAY).isoformat())
    assert wednesday["verdict"] == "skipped" and "overlap" in wednesday["message"]


async def test_not_a_fire_time_names_the_nearest_ones(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(api, alice, pool, cron="0 9 * * 1-5")
    saturday = await _explain(api, alice, sid, "2026-03-07T09:00:00Z")
    assert (saturday["verdict"], saturday["fire_time"]) == ("not_a_fire_time", False)
    assert saturday["previous_fire_time"] == "2026-03-06T09:00:00+00:00"
    assert saturday["next_fire_time"] == "2026-03-09T09:00:00+00:00"
    before = await _explain(api, alice, sid, "2026-02-20T09:00:00Z")
    assert before["verdict"] == "before_created"


async def test_a_pause_that_covered_the_slot(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(api, alice, pool, misfire="run_once")
    reason = {"until": None, "reason": "quarterly freeze"}
    await _change(pool, sid, MONDAY - timedelta(hours=2), "pause", reason)
    await _change(pool, sid, MONDAY + DAY + timedelta(hours=2), "resume", {})
    # On resume the misfire policy ran Tuesday's slot once, standing for the missed Monday.
    await _run(pool, sid, MONDAY + DAY, "succeeded", missed_slots=1)
    monday = await _explain(api, alice, sid, MONDAY.isoformat())
    assert monday["verdict"] == "paused"
    assert "quarterly freeze" in monday["message"] and "alice" in monday["message"]
    assert monday["pause"]["action"] == "pause"
    assert [r["slot"] for r in monday["runs"]] == [(MONDAY + DAY).isoformat()]
    assert (await _explain(api, alice, sid, (MONDAY + DAY).isoformat()))["verdict"] == "ran"


async def test_slots_coalesced_by_the_misfire_policy(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(api, alice, pool)
    await _run(pool, sid, MONDAY - DAY, "succeeded")
    folded = await _run(pool, sid, MONDAY + 2 * DAY, "succeeded", missed_slots=2)
    for day in (0, 1):
        found = await _explain(api, alice, sid, (MONDAY + day * DAY).isoformat())
        assert found["verdict"] == "coalesced", found
        assert [r["id"] for r in found["runs"]] == [folded]
        assert "run_once" in found["message"]
    await pool.execute("UPDATE schedules SET next_fire_at = $2 WHERE id = $1", sid, NOW + DAY)
    await pool.execute("DELETE FROM runs WHERE slot = $1", MONDAY - DAY)
    gone = await _explain(api, alice, sid, (MONDAY - DAY).isoformat())
    assert gone["verdict"] == "missed"


async def test_future_and_due_slots(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(api, alice, pool)
    tomorrow = (MONDAY + 8 * DAY).isoformat()
    assert (await _explain(api, alice, sid, tomorrow))["verdict"] == "scheduled"
    await pool.execute("UPDATE schedules SET next_fire_at = $2 WHERE id = $1", sid, MONDAY)
    due = await _explain(api, alice, sid, (MONDAY + 3 * DAY).isoformat())
    assert due["verdict"] == "due" and "scheduler" in due["message"]
    await api.post(f"/v1/schedules/{sid}/pause", alice, json={"reason": "not now"})
    paused = await _explain(api, alice, sid, tomorrow)
    assert paused["verdict"] == "paused" and "not now" in paused["message"]
    await api.post(
        f"/v1/schedules/{sid}/pause", alice, json={"until": (NOW + timedelta(hours=1)).isoformat()}
    )
    assert (await _explain(api, alice, sid, tomorrow))["verdict"] == "scheduled"


async def test_the_expression_in_force_then_and_local_times(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(api, alice, pool, timezone="Europe/Paris", cron="30 10 * * *")
    await _change(
        pool, sid, MONDAY + 3 * DAY, "update", {"expression": ["0 9 * * *", "30 10 * * *"]}
    )
    # 09:00 in Paris (08:00 UTC) was a slot before the edit, and is not one since.
    old = await _explain(api, alice, sid, "2026-03-02T09:00:00")
    assert old["at"] == "2026-03-02T08:00:00+00:00"
    assert old["fire_time"] is True
    assert old["expression"] == {
        "kind": "cron",
        "expression": "0 9 * * *",
        "timezone": "Europe/Paris",
    }
    new = await _explain(api, alice, sid, "2026-03-06T09:00:00+01:00")
    assert (new["fire_time"], new["verdict"]) == (False, "not_a_fire_time")
    assert new["next_fire_time"] == "2026-03-06T09:30:00+00:00"


@pytest.mark.parametrize("at", ["", "yesterday", "1900-01-01T00:00:00Z", "2026-13-01T00:00:00Z"])
async def test_bad_instants_are_422(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any], at: str
) -> None:
    sid = await _schedule(api, alice, pool)
    reply = await api.get(f"/v1/schedules/{sid}/explain", alice, params={"at": at})
    assert reply.status == 422 and reply.body["error"]["field"] == "at"


async def test_a_slot_older_than_the_retention_is_purged_not_missed(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(NOW)
    retention = timedelta(days=30)
    async with api_support.client(pool, clock=clock, retention=retention) as api:
        alice = await api.token("alice")
        sid = await _schedule(api, alice, pool)
        long_ago = MONDAY - 60 * DAY
        await pool.execute("UPDATE schedules SET created_at = $2 WHERE id = $1", sid, long_ago)
        await pool.execute(
            "UPDATE schedule_changes SET at = $2 WHERE schedule_id = $1", sid, long_ago
        )
        horizon = NOW - retention  # MONDAY - 23 days + 3 hours
        old, kept, lost = MONDAY - 40 * DAY, MONDAY - 22 * DAY, MONDAY - 21 * DAY
        await _run(pool, sid, old, "succeeded")  # finished at its slot: older than the horizon
        await _run(pool, sid, kept, "succeeded")
        assert old < horizon < kept < lost
        # The retention role itself, on the same injected clock, purges what it promised to.
        assert await Retention(pool, clock, Metrics(), retention=retention).run_once() == 1

        purged = await _explain(api, alice, sid, old.isoformat())
        assert purged["verdict"] == "purged", purged
        assert purged["message"] == (
            "no record: history older than the retention of 30d was purged"
        )
        assert purged["fire_time"] is True and purged["runs"] == []
        # Inside the retention the ledger still explains every slot from its rows.
        assert (await _explain(api, alice, sid, kept.isoformat()))["verdict"] == "ran"
        assert (await _explain(api, alice, sid, lost.isoformat()))["verdict"] == "missed"
        # A pause recorded in the change history still explains a slot beyond the horizon.
        await _change(pool, sid, old - 2 * DAY, "pause", {"reason": "winter break"})
        await _change(pool, sid, old + DAY, "resume", {})
        paused = await _explain(api, alice, sid, old.isoformat())
        assert paused["verdict"] == "paused" and "winter break" in paused["message"]
    # The verdict follows the configured retention: under 90 days that slot is inside it.
    async with api_support.client(pool, clock=clock, retention=timedelta(days=90)) as api:
        alice = await api.token("alice")
        await pool.execute("DELETE FROM schedule_changes WHERE action IN ('pause', 'resume')")
        longer = await _explain(api, alice, sid, old.isoformat())
        assert longer["verdict"] == "missed", longer
