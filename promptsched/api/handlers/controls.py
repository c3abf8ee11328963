"""Schedule controls and history: pause (optionally until an instant, with a reason), resume,
trigger now, backfill a past range, and the change history (who changed what, when)."""

from __future__ import annotations

from aiohttp import web

from promptsched.api.handlers.schedules import schedule_reply
from promptsched.api.http import CURSOR, ID_PARAM, LIMIT, Call, Operation, Reply, json_reply
from promptsched.errors import ValidationError
from promptsched.ops import lookups, validate, views
from promptsched.ops import runs as run_ops
from promptsched.ops import schedules as schedule_ops


async def pause(call: Call) -> web.StreamResponse:
    raw_until = call.body.get("until")
    until = validate.instant(raw_until, "until") if raw_until is not None else None
    async with call.deps.pool.acquire() as conn:
        if until is not None and until <= await schedule_ops.db_now(conn, call.deps.clock):
            raise ValidationError("until", "must be in the future")
        row = await schedule_ops.pause_schedule(
            conn,
            call.params["id"],
            owner=call.scope,
            actor=call.who.actor,
            until=until,
            reason=call.body.get("reason"),
        )
    return schedule_reply(row)


async def resume(call: Call) -> web.StreamResponse:
    async with call.deps.pool.acquire() as conn:
        row = await schedule_ops.resume_schedule(
            conn, call.params["id"], owner=call.scope, actor=call.who.actor
        )
    return schedule_reply(row)


async def trigger(call: Call) -> web.StreamResponse:
    async with call.deps.pool.acquire() as conn:
        run = await schedule_ops.trigger_schedule(
            conn, call.deps.clock, call.params["id"], owner=call.scope, actor=call.who.actor
        )
        detail = await run_ops.load_run(conn, run["id"], call.scope)
    return json_reply(detail, status=201)


async def backfill(call: Call) -> web.StreamResponse:
    start = validate.instant(call.body["start"], "start")
    end = validate.instant(call.body["end"], "end")
    async with call.deps.pool.acquire() as conn:
        runs = await schedule_ops.backfill_schedule(
            conn,
            call.deps.clock,
            call.params["id"],
            start,
            end,
            owner=call.scope,
            actor=call.who.actor,
        )
    return json_reply(views.backfill(runs), status=201)


async def history(call: Call) -> web.StreamResponse:
    """Newest first. The history outlives a deleted schedule, so it stays readable."""
    schedule_id, limit = call.params["id"], call.params["limit"]
    cursor = call.params["cursor"]
    rows = await lookups.changes_page(
        call.deps.pool, schedule_id, call.scope, int(cursor) if cursor else None, limit + 1
    )
    if not rows:
        await lookups.schedule_or_missing(call.deps.pool, schedule_id, call.scope)
    return json_reply(views.page([views.change(row) for row in rows], limit))


_SCHEDULE = Reply("the schedule, with its next 5 fire times", "Schedule", headers=("ETag",))
_MISSING = Reply("no such schedule (or not yours)", "Error")

OPERATIONS = (
    Operation(
        "POST", "/v1/schedules/{id}/pause", pause, "pauseSchedule", "Pause a schedule",
        "schedules", {"200": _SCHEDULE, "404": _MISSING}, params=(ID_PARAM,), body="Pause",
        body_required=False,
        description="No new slots until resumed (or until `until`). Slots that fall due "
        "meanwhile meet the schedule's misfire policy on resume.",
    ),
    Operation(
        "POST", "/v1/schedules/{id}/resume", resume, "resumeSchedule", "Resume a schedule",
        "schedules", {"200": _SCHEDULE, "404": _MISSING}, params=(ID_PARAM,),
    ),
    Operation(
        "POST", "/v1/schedules/{id}/trigger", trigger, "triggerSchedule", "Run a schedule now",
        "schedules",
        {"201": Reply("the new run (origin manual)", "RunDetail"), "404": _MISSING,
         "409": Reply("the schedule is paused: resume it first", "Error")},
        params=(ID_PARAM,),
        description="A paused schedule is not run (its run would be skipped as `disabled`): "
        "the answer is 409 naming the pause; resume the schedule first.",
    ),
    Operation(
        "POST", "/v1/schedules/{id}/backfill", backfill, "backfillSchedule",
        "Create runs for past slots", "schedules",
        {"201": Reply("the runs created (slots that already had one are left alone)",
                      "BackfillResult"), "404": _MISSING},
        params=(ID_PARAM,), body="Backfill",
    ),
    Operation(
        "GET", "/v1/schedules/{id}/history", history, "scheduleHistory",
        "Who changed what, when", "schedules",
        {"200": Reply("one page of changes, newest first", "ChangePage"), "404": _MISSING},
        params=(ID_PARAM, CURSOR, LIMIT),
    ),
)  # fmt: skip
