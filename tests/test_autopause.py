"""Pause after N consecutive dead runs: the pause, its history row and the owner's "paused"
messages are one statement, so they exist together or not at all."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from promptsched import netguard
from promptsched.ops import notify_targets
from promptsched.roles import autopause
from promptsched.store import queries, sqlfiles
from tests import factories
from tests.factories import EPOCH


async def _failing_schedule(pool: asyncpg.Pool[Any], dead: int) -> tuple[int, int]:
    """A schedule that pauses after 2 dead runs, notifying by email and webhook on failure,
    with ``dead`` dead runs; returns it and its last run."""
    sid = await factories.schedule(pool)
    notify = notify_targets.validate_targets(
        {"email": ["ops@example.com"], "webhook": {"url": "https://hooks.example.com/x"}},
        allow=netguard.NO_WEBHOOK_ALLOW,
    )
    await pool.execute(
        "UPDATE schedules SET notify = $2, pause_after_failures = 2 WHERE id = $1", sid, notify
    )
    rid = 0
    for n in range(dead):
        rid = await factories.pending_run(pool, sid, EPOCH + timedelta(minutes=n))
        await pool.execute("UPDATE runs SET status = 'dead', finished_at = slot WHERE id = $1", rid)
    return sid, rid


async def _state(pool: asyncpg.Pool[Any], sid: int) -> tuple[bool, list[str], list[str]]:
    enabled = await pool.fetchval("SELECT enabled FROM schedules WHERE id = $1", sid)
    changes = await pool.fetch(
        "SELECT action FROM schedule_changes WHERE schedule_id = $1 AND actor = 'promptsched'",
        sid,
    )
    owed = await pool.fetch(
        "SELECT channel FROM outbox WHERE schedule_id = $1 AND event = 'paused' ORDER BY 1", sid
    )
    return enabled, [c["action"] for c in changes], [o["channel"] for o in owed]


class _Recorder:
    """A connection that remembers every statement sent through it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sent: list[str] = []

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        self.sent.append(query)
        return await self.conn.fetch(query, *args, timeout=timeout)

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        self.sent.append(query)
        return await self.conn.fetchrow(query, *args, timeout=timeout)

    async def fetchval(
        self,
        query: str,
        *args: Any,
        column: int = 0,
        timeout: float | None = None,
    ) -> Any:
        self.sent.append(query)
        return await self.conn.fetchval(query, *args, column=column, timeout=timeout)

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        self.sent.append(query)
        result: str = await self.conn.execute(query, *args, timeout=timeout)
        return result


async def test_pause_history_and_paused_messages_are_written_by_one_statement(
    pool: asyncpg.Pool[Any],
) -> None:
    sid, rid = await _failing_schedule(pool, dead=2)
    async with pool.acquire() as conn:
        recorder = _Recorder(conn)
        assert await autopause.check(recorder, sid, rid, EPOCH) is True
    # One round trip, the one named statement: there is no "between" for a crash to hit.
    assert recorder.sent == [sqlfiles.queries()["schedule_pause_if_failing"]]
    assert await _state(pool, sid) == (False, ["auto_pause"], ["email", "webhook"])
    row = await pool.fetchrow("SELECT pause_reason, updated_at FROM schedules WHERE id = $1", sid)
    assert row["pause_reason"] == "paused after 2 consecutive dead runs"
    change = await pool.fetchrow(
        "SELECT changes, at FROM schedule_changes WHERE schedule_id = $1 AND action = 'auto_pause'",
        sid,
    )
    assert change["changes"] == {"reason": "paused after 2 consecutive dead runs"}
    assert change["at"] == row["updated_at"] == EPOCH  # the one clock, as the caller passed it
    keys = await pool.fetch(
        "SELECT run_id, idempotency_key FROM outbox WHERE schedule_id = $1 ORDER BY 2", sid
    )
    assert [(k["run_id"], k["idempotency_key"]) for k in keys] == [
        (rid, f"promptsched-{rid}-paused-email"),
        (rid, f"promptsched-{rid}-paused-webhook"),
    ]
    # Checking again (a second replica, a retried check) writes nothing more.
    assert await autopause.check(pool, sid, rid, EPOCH) is False
    assert await _state(pool, sid) == (False, ["auto_pause"], ["email", "webhook"])


async def test_a_schedule_not_failing_enough_is_left_alone(pool: asyncpg.Pool[Any]) -> None:
    sid, rid = await _failing_schedule(pool, dead=1)
    assert await queries.schedule_pause_if_failing(pool, sid, rid, EPOCH) is None
    assert await _state(pool, sid) == (True, [], [])


async def test_when_any_part_fails_nothing_is_written(pool: asyncpg.Pool[Any]) -> None:
    # The outbox refuses the message (as a crash or a lost connection mid-way would stop it):
    # the pause and the history row must not land without it.
    sid, rid = await _failing_schedule(pool, dead=2)
    await pool.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'outbox refused'; END $$"
    )
    await pool.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    try:
        await autopause.check(pool, sid, rid, EPOCH)
    except asyncpg.RaiseError as exc:
        assert "outbox refused" in str(exc)
    else:
        raise AssertionError("the refused outbox insert did not fail the check")
    assert await _state(pool, sid) == (True, [], [])
