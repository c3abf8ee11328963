"""Run operations shared by the CLI, the HTTP API and the console: cancel, replay, and what
changed between two runs of a schedule."""

from __future__ import annotations

import functools
from typing import Any

import asyncpg

from promptsched import offload
from promptsched.clock import Clock
from promptsched.domain import RunOrigin, RunStatus
from promptsched.errors import NotFound, StateConflict, ValidationError
from promptsched.monitor import changes
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


_COMPARING = "comparing the two outputs"


async def diff_runs(
    db: queries.DB, run_id: int, other_id: int, owner: str | None
) -> dict[str, Any]:
    """What changed from run ``run_id`` to run ``other_id``, two runs of one schedule, as a
    ``changed`` monitor compares them: the JSON paths with their old and new values when both
    have a structured answer, else a unified diff of their text (docs/monitors.md)."""
    rows = []
    for field, wanted in (("a", run_id), ("b", other_id)):
        row = await queries.run_get(db, wanted, owner)
        if row is None:
            raise NotFound("run", wanted)
        if row["output"] is None:
            raise ValidationError(
                field, f"run {wanted} has no output ({row['status']}): compare runs that succeeded"
            )
        rows.append(row)
    old, new = rows
    if old["schedule_id"] != new["schedule_id"]:
        raise ValidationError(
            "b", f"run {other_id} is of schedule {new['schedule_id']}, run {run_id} of schedule "
            f"{old['schedule_id']}: compare two runs of one schedule",
        )  # fmt: skip
    out: dict[str, Any] = {"schedule_id": old["schedule_id"], "a": run_id, "b": other_id}
    # Outputs of up to 10 MB are compared in a worker thread (bounded, but seconds at worst).
    if old["output_json"] is not None and new["output_json"] is not None:
        compare = functools.partial(changes.json_changes, old["output_json"], new["output_json"])
        paths = await offload.run(compare, field="b", lane="render", what=_COMPARING)
        return {**out, "kind": "json", "changed": bool(paths), "paths": [c.json() for c in paths]}
    lines = await offload.run(
        functools.partial(
            changes.text_diff, old["output"], new["output"],
            old_name=f"run {run_id}", new_name=f"run {other_id}",
        ),
        field="b", lane="render", what=_COMPARING,
    )  # fmt: skip
    return {**out, "kind": "text", "changed": bool(lines), "diff": lines}
