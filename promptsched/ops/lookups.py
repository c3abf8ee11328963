"""The reads the HTTP API and the console share, each scoped to an owner (``None``: an admin's
every owner): a schedule, its runs and history, a run with its parts, the dead letters, and
whether the schema is this version's. The interfaces reach the store only through here and the
other operations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from asyncpg import Record

from promptsched.clock import Clock
from promptsched.domain import Schedule
from promptsched.errors import NotFound, StateConflict
from promptsched.ops import notifications
from promptsched.store import migrate, queries
from promptsched.store import pool as pools
from promptsched.store.pool import Conn

DB = queries.DB


async def schedule(db: DB, schedule_id: int, owner: str | None) -> Schedule | None:
    return await queries.schedule_get(db, schedule_id, owner)


async def schedule_or_missing(db: DB, schedule_id: int, owner: str | None) -> Schedule:
    """The schedule; NotFound unless it exists and is the owner's."""
    row = await queries.schedule_get(db, schedule_id, owner)
    if row is None:
        raise NotFound("schedule", schedule_id)
    return row


async def schedules_page(
    db: DB, *, owner: str | None, enabled: bool | None, name: str | None, after_id: int, limit: int
) -> list[Schedule]:
    return await queries.schedule_search(
        db, owner=owner, enabled=enabled, name=name, after_id=after_id, limit=limit
    )


async def latest_finished(db: DB, schedule_ids: Sequence[int]) -> dict[int, Record]:
    """Each schedule's latest finished run, by schedule id."""
    rows = await queries.run_latest_finished_many(db, schedule_ids)
    return {row["schedule_id"]: row for row in rows}


async def changes_page(
    db: DB, schedule_id: int, owner: str | None, before_id: int | None, limit: int
) -> list[Record]:
    """A schedule's change history, newest first. It outlives a deleted schedule."""
    return await queries.schedule_change_page(db, schedule_id, owner, before_id, limit)


async def runs_page(
    db: DB,
    *,
    schedule_id: int | None,
    status: str | None,
    owner: str | None,
    before_id: int | None,
    limit: int,
) -> list[Record]:
    return await queries.run_list(
        db,
        schedule_id=schedule_id,
        status=status,
        owner=owner,
        before_id=before_id,
        limit=limit,
    )


async def restarted(db: DB, run_ids: list[int]) -> set[int]:
    """Of these runs, those that lost an attempt (its process stopped: a crash, a restart)."""
    return await queries.run_lost_among(db, run_ids) if run_ids else set()


async def run(db: DB, run_id: int, owner: str | None) -> Record | None:
    return await queries.run_get(db, run_id, owner)


@dataclass(frozen=True, slots=True)
class RunParts:
    """A run's row with its attempts, the run that replayed it, and its notifications."""

    row: Record
    attempts: list[Record]
    replay: Record | None
    sent: list[dict[str, object]]


async def run_parts(db: DB, run_id: int, owner: str | None) -> RunParts:
    """NotFound unless the run exists and is the owner's."""
    row = await queries.run_get(db, run_id, owner)
    if row is None:
        raise NotFound("run", run_id)
    attempts = await queries.run_attempts_list(db, run_id)
    replay = await queries.run_get_replay(db, run_id)
    sent = await notifications.list_run_notifications(db, run_id, owner)
    return RunParts(row, attempts, replay, sent)


async def run_output(db: DB, run_id: int, owner: str | None) -> str:
    """The run's whole output; NotFound unless the run exists and is the owner's,
    StateConflict when it has no output (not finished, or it failed)."""
    row = await queries.run_output(db, run_id, owner)
    if row is None:
        raise NotFound("run", run_id)
    if row["output"] is None:
        raise StateConflict(f"run {run_id} has no output ({row['status']})")
    output: str = row["output"]
    return output


async def dead_runs_page(
    db: DB, owner: str | None, before_id: int | None, limit: int
) -> list[Record]:
    return await queries.run_dead_page(db, owner, before_id, limit)


async def notification(db: DB, notification_id: int, owner: str | None) -> Record | None:
    return await queries.outbox_get(db, notification_id, owner)


async def slot_history(db: DB, schedule_id: int, at: datetime) -> tuple[list[Record], list[Record]]:
    """What explain reasons from: the changes around the instant and the runs of its slot."""
    changes = await queries.schedule_change_around(db, schedule_id, at)
    found = await queries.run_list_for_slot(db, schedule_id, at)
    return changes, found


async def providers_cooling(db: DB, clock: Clock) -> list[Record]:
    """The providers whose breaker is open now, with the reason and until when."""
    return await queries.provider_cooling(db, clock.sql_now())


async def provider_weather(db: DB, clock: Clock) -> list[dict[str, Any]]:
    """Every provider's fleet-wide state as the claims meet it (docs/providers.md, "When the
    provider pushes back"): ``breaker`` (closed, half_open, open) with ``open_until``,
    ``reason`` and ``opened_at``; ``allowed_concurrency`` while it ramps back after an
    opening (None: its configured max_concurrency); ``paced_until`` and ``pace_header`` while
    its own rate-limit headers hold every replica back; ``learned_allowance`` requests per
    ``learned_window`` seconds, the rate it learned from a throttling window (None: none).
    For the console and ``status``."""
    found = []
    for row in await queries.provider_weather(db, clock.sql_now()):
        found.append({
            "provider": row["provider"],
            "breaker": "open" if row["open"] else "half_open" if row["half_open"] else "closed",
            "open_until": row["open_until"] if row["open"] else None,
            "reason": row["reason"],
            "opened_at": row["opened_at"],
            "failures": row["failures"],
            "allowed_concurrency": None if row["ramp"] is None else int(row["ramp"] + 1e-6),
            "paced_until": row["paced_until"] if row["paced"] else None,
            "pace_header": row["pace_reason"] if row["paced"] else None,
            "learned_allowance": row["allowance"],
            "learned_window": row["window_seconds"] if row["allowance"] is not None else None,
        })  # fmt: skip
    return found


async def check_schema(conn: Conn) -> None:
    """SchemaMismatch (naming the command that fixes it) unless the schema is this version's."""
    await migrate.check(conn)


T = TypeVar("T")


async def retry_stale(work: Callable[[], Awaitable[T]]) -> T:
    """A request as one unit of work: run once more if a statement prepared before a schema
    change failed in one of its transactions (store/pool.py), so that a migration the next
    release runs never answers a request of this one with an error."""
    return await pools.retry_stale(work)
