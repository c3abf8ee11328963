"""Run operations shared by the CLI, the HTTP API and the console: cancel and replay."""

from __future__ import annotations

from typing import Any

import asyncpg

from promptsched.clock import Clock
from promptsched.domain import RunOrigin, RunStatus
from promptsched.errors import NotFound, StateConflict
from promptsched.ops import lookups, views
from promptsched.store import queries
from promptsched.store.pool import Conn


async def cancel_run(
    conn: Conn, clock: Clock, run_id: int, *, owner: str | None, actor: str
) -> asyncpg.Record:
    """A pending run ends ``cancelled`` at once; a running one gets ``cancel_requested``, which
    its worker's next heartbeat turns into a cooperative stop. Cancelling a cancelled run is a
    no-op; any other finished run conflicts."""
    row = await queries.run_cancel(conn, run_id, owner, clock.sql_now(), f"cancelled by {actor}")
    if row is not None:
        return row
    current = await queries.run_get(conn, run_id, owner)
    if current is None:
        raise NotFound("run", run_id)
    if current["status"] == RunStatus.CANCELLED:
        return current
    raise StateConflict(
        f"run {run_id} is {current['status']}: only a pending or running run can be cancelled"
    )


async def replay_run(
    conn: Conn, clock: Clock, run_id: int, *, owner: str | None, actor: str
) -> asyncpg.Record:
    """A new run (origin ``replay``, ``replay_of`` = the old id) for the slot of a dead run;
    each dead run is replayed at most once."""
    async with conn.transaction():
        row = await queries.run_insert_replay(conn, run_id, owner, clock.sql_now())
        if row is None:
            current = await queries.run_get(conn, run_id, owner)
            if current is None:
                raise NotFound("run", run_id)
            if current["status"] != RunStatus.DEAD:
                raise StateConflict(
                    f"run {run_id} is {current['status']}: only a dead run can be replayed"
                )
            existing = await queries.run_get_replay(conn, run_id)
            again = f" as run {existing['id']}" if existing is not None else ""
            raise StateConflict(f"run {run_id} was already replayed{again}")
        await queries.run_notify_ready(conn, RunOrigin.REPLAY)  # delivered at commit
        return row


async def load_run(db: queries.DB, run_id: int, owner: str | None) -> dict[str, Any]:
    """One run with its attempts, replay and notifications; NotFound unless it is the owner's."""
    parts = await lookups.run_parts(db, run_id, owner)
    return views.run_detail(parts.row, parts.attempts, parts.replay, parts.sent)
