"""Schedule operations shared by the CLI, the HTTP API and the console: create, update, pause,
resume, trigger, backfill and delete, each with its history row and change notice."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from promptsched import netguard, offload
from promptsched.clock import Clock
from promptsched.domain import ChangeAction, RunOrigin, Schedule, ScheduleInput
from promptsched.errors import (
    NotFound,
    QuotaExceeded,
    StateConflict,
    ValidationError,
    VersionConflict,
)
from promptsched.ops import inputs, views
from promptsched.schedule import fire_times, spec
from promptsched.store import queries
from promptsched.store.pool import Conn
from promptsched.tools.base import Catalog


async def db_now(db: queries.DB, clock: Clock) -> datetime:
    return await queries.clock_now(db, clock.sql_now())


async def create_schedule(
    db: queries.DB | asyncpg.Pool[Any],
    clock: Clock,
    values: ScheduleInput,
    *,
    owner: str,
    actor: str | None = None,
    max_schedules: int = 0,
) -> Schedule:
    """The schedule, its name registered and its history row, in one transaction (a
    savepoint in the caller's): a name another schedule holds leaves nothing written.
    ``max_schedules``: the owner's quota (PROMPTSCHED_OWNER_MAX_SCHEDULES; 0: none), checked
    for a schedule that is not a follow-up's."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            return await create_schedule(
                conn, clock, values, owner=owner, actor=actor, max_schedules=max_schedules
            )
    assert isinstance(db, asyncpg.Connection | PoolConnectionProxy)
    now = await db_now(db, clock)
    # an expression that never fires (before 2200) is an error; the search runs off the loop
    first = await offload.run(lambda: fire_times.check_fires(inputs.spec_of(values), now))
    async with db.transaction():
        if max_schedules > 0 and values.followup_key is None:
            await check_schedule_quota(db, owner, max_schedules)
        row = await queries.schedule_insert(db, values, owner=owner, next_fire_at=first)
        await claim_name(db, row)
        await queries.schedule_change_insert(
            db, row.id, owner, actor or owner, ChangeAction.CREATE,
            {"fields": views.schedule_json(row)},
        )  # fmt: skip
        await queries.schedule_notify_changed(db, row.id)
    return row


async def check_schedule_quota(db: queries.DB, owner: str, limit: int) -> None:
    """Refuse a new schedule of an owner who has ``limit`` already, naming the limit; in the
    caller's transaction, which holds the owner's lock from here to its commit."""
    await queries.schedule_lock_owner(db, owner)
    have = await queries.schedule_count_owned(db, owner)
    if have >= limit:
        raise QuotaExceeded(
            "owner",
            f"{owner} has {have:,} schedules, the most one owner may have "
            f"(PROMPTSCHED_OWNER_MAX_SCHEDULES={limit}); delete one first, or ask the "
            "operator to raise the quota",
        )


async def claim_name(db: queries.DB, row: Schedule) -> None:
    """Register the schedule's name, unique per owner (a follow-up is named by its key);
    a name another schedule holds is refused naming it, and the caller's transaction rolls
    back whatever it wrote."""
    if row.followup_key is not None:
        return
    holder = await queries.schedule_name_claim(db, row.owner, row.name, row.id)
    if holder != row.id:
        raise ValidationError(
            "name",
            f"schedule {holder} is already named {row.name!r} (names are unique per owner); "
            "choose another name, or change that schedule",
        )


def input_from_row(row: Schedule) -> dict[str, Any]:
    """A stored schedule as the raw input ``validate`` takes, for merging a patch into it."""
    data = views.schedule_json(row)
    keep = {f for f in ScheduleInput.__dataclass_fields__} - {"misfire_grace"}
    raw = {key: data[key] for key in keep if key in data and data[key] is not None}
    raw["misfire_grace"] = data["misfire_grace"]
    raw["notify"] = dict(row.notify or {})  # the stored targets, secret included
    return raw


async def update_schedule(
    conn: Conn,
    clock: Clock,
    schedule_id: int,
    patch: Mapping[str, Any],
    *,
    owner: str | None,
    actor: str,
    providers: Collection[str],
    provider_kinds: Mapping[str, str] | None = None,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
    expected_version: int | None = None,
    tools: Catalog | None = None,
) -> Schedule:
    """Apply a partial update. A new expression or zone takes effect from the next slot: slots
    already enqueued are not enqueued again, and a slot due now is not lost."""
    async with conn.transaction():
        row = await queries.schedule_get_for_update(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        if expected_version is not None and row.version != expected_version:
            raise VersionConflict(row.version)
        unknown = sorted(set(patch) - inputs.EDITABLE)
        if unknown:
            raise ValidationError(unknown[0], "is not a field that can be changed")
        merged = input_from_row(row)
        if any(kind in patch for kind in inputs.KINDS):
            merged.pop("kind", None)
            merged.pop("expression", None)
        merged.update(patch)
        values = await offload.run(
            lambda: inputs.validate(
                merged,
                providers=providers,
                provider_kinds=provider_kinds,
                webhook_allow=webhook_allow,
                current_notify=row.notify,
                tools=tools,
                template_vars=frozenset(row.vars or {}),
            )
        )
        cursor = row.next_fire_at
        timing = ("kind", "expression", "timezone", "dst_gap", "dst_fold")
        if any(getattr(values, f) != getattr(row, f) for f in timing):
            now = await db_now(conn, clock)
            after = min(now, cursor) if cursor is not None else now
            since = after - timedelta(microseconds=1)
            cursor = await offload.run(
                lambda: fire_times.check_fires(inputs.spec_of(values), since)
            )
        updated = await queries.schedule_update(
            conn, schedule_id, row.version, values, next_fire_at=cursor
        )
        assert updated is not None  # the row is locked: its version cannot move
        if updated.name != row.name:
            await claim_name(conn, updated)
        before, after_json = views.schedule_json(row), views.schedule_json(updated)
        changes = {
            k: [before[k], after_json[k]]
            for k in after_json
            if k not in ("version", "updated_at") and before.get(k) != after_json[k]
        }
        await queries.schedule_change_insert(
            conn, schedule_id, row.owner, actor, ChangeAction.UPDATE, changes
        )
        await queries.schedule_notify_changed(conn, schedule_id)
        return updated


async def pause_schedule(
    conn: Conn,
    schedule_id: int,
    *,
    owner: str | None,
    actor: str,
    until: datetime | None = None,
    reason: str | None = None,
) -> Schedule:
    async with conn.transaction():
        row = await queries.schedule_pause(conn, schedule_id, owner, until, reason)
        if row is None:
            raise NotFound("schedule", schedule_id)
        await queries.schedule_change_insert(
            conn, schedule_id, row.owner, actor, ChangeAction.PAUSE,
            {"until": until.isoformat() if until else None, "reason": reason},
        )  # fmt: skip
        await queries.schedule_notify_changed(conn, schedule_id)
        return row


async def resume_schedule(
    conn: Conn, schedule_id: int, *, owner: str | None, actor: str
) -> Schedule:
    """Resume; slots missed while paused meet the schedule's misfire policy on the next tick."""
    async with conn.transaction():
        row = await queries.schedule_resume(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        await queries.schedule_change_insert(
            conn, schedule_id, row.owner, actor, ChangeAction.RESUME, {}
        )
        await queries.schedule_notify_changed(conn, schedule_id)
        return row


async def trigger_schedule(
    conn: Conn, clock: Clock, schedule_id: int, *, owner: str | None, actor: str
) -> asyncpg.Record:
    """A run now, outside the cadence (origin ``manual``). A paused schedule is refused: its
    run would be skipped as ``disabled`` by the worker's claim-time check (invariant 7)."""
    async with conn.transaction():
        row = await queries.schedule_get(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        if not row.enabled:
            raise StateConflict(f"schedule {schedule_id} is {_paused(row)}; resume it to run it")
        run = await queries.run_insert_manual(conn, schedule_id, clock.sql_now())
        assert run is not None
        await queries.schedule_change_insert(
            conn, schedule_id, row.owner, actor, ChangeAction.TRIGGER,
            {"run_id": run["id"]},
        )  # fmt: skip
        await queries.run_notify_ready(conn, RunOrigin.MANUAL)
        return run


def _paused(row: Schedule) -> str:
    until = row.paused_until
    reason = row.pause_reason
    text = f"paused until {until.isoformat()}" if until is not None else "paused"
    return f"{text} ({reason})" if reason else text


MAX_BACKFILL = 1000


async def backfill_schedule(
    conn: Conn,
    clock: Clock,
    schedule_id: int,
    start: datetime,
    end: datetime,
    *,
    owner: str | None,
    actor: str,
) -> list[asyncpg.Record]:
    """Runs for the past slots in [start, end] that have none yet (origin ``backfill``)."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValidationError("start", "start and end need a UTC offset")
    if end < start:
        raise ValidationError("end", "must not be before start")
    async with conn.transaction():
        row = await queries.schedule_get(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        now = await db_now(conn, clock)
        if end > now:
            raise ValidationError("end", "a backfill covers the past only")
        schedule_spec = views.schedule_spec(row)
        slots = []
        for slot in fire_times.iter_after(schedule_spec, start - timedelta(microseconds=1)):
            if slot > end:
                break
            slots.append(slot)
            if len(slots) > MAX_BACKFILL:
                raise ValidationError(
                    "end", f"the range holds more than {MAX_BACKFILL} slots; split it"
                )
        created = await queries.run_insert_backfill(conn, schedule_id, slots, clock.sql_now())
        await queries.schedule_change_insert(
            conn, schedule_id, row.owner, actor, ChangeAction.BACKFILL,
            {"start": start.isoformat(), "end": end.isoformat(), "runs": len(created)},
        )  # fmt: skip
        if created:
            await queries.run_notify_ready(conn, RunOrigin.BACKFILL)
        return created


async def delete_schedule(conn: Conn, schedule_id: int, *, owner: str | None, actor: str) -> None:
    async with conn.transaction():
        row = await queries.schedule_get_for_update(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        await queries.schedule_change_insert(
            conn, schedule_id, row.owner, actor, ChangeAction.DELETE, {"name": row.name}
        )
        await queries.schedule_delete(conn, schedule_id, owner)
        await queries.schedule_notify_changed(conn, schedule_id)


def preview(spec_: spec.Spec, after: datetime, count: int) -> list[datetime]:
    """The next fire times, by the very code path the scheduler uses."""
    return fire_times.preview(spec_, after, count)
