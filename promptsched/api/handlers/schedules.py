"""Schedules: create (with the next fire times), list with filters and a cursor, get with an
ETag, patch under optimistic concurrency (If-Match or ``version``), delete."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from promptsched import errors, offload
from promptsched.api.http import (
    CURSOR,
    ID_PARAM,
    LIMIT,
    ApiError,
    Call,
    Operation,
    Param,
    Reply,
    json_reply,
)
from promptsched.errors import ValidationError
from promptsched.ops import budgets as budget_ops
from promptsched.ops import fleet, inputs, lookups, views
from promptsched.ops import schedules as schedule_ops


def schedule_reply(row: Any, status: int = 200, *, reveal_secret: bool = False) -> web.Response:
    data = views.schedule(row, with_next=True, reveal_secret=reveal_secret)
    return json_reply(data, status=status, headers={"ETag": views.etag(row)})


async def schedule_reply_off_loop(
    row: Any, status: int = 200, *, reveal_secret: bool = False, warnings: list[str] | None = None
) -> web.Response:
    """``schedule_reply``, its next fire times computed off the event loop; ``warnings`` (what
    will not work as the schedule asks) when there are any."""
    data = await offload.run(
        lambda: views.schedule(row, with_next=True, reveal_secret=reveal_secret)
    )
    if warnings:
        data["warnings"] = warnings
    return json_reply(data, status=status, headers={"ETag": views.etag(row)})


async def create(call: Call) -> web.StreamResponse:
    deps = call.deps
    # Checked against what the running fleet published (ops/fleet.py).
    found = await fleet.current(deps.pool, deps.clock, deps.published)
    checks = found.checks(deps.tool_catalog())
    values = await offload.run(lambda: inputs.validate(call.body, **checks))
    async with deps.pool.acquire() as conn, conn.transaction():
        row = await schedule_ops.create_schedule(
            conn, deps.clock, values, owner=call.who.owner, actor=call.who.actor,
            max_schedules=deps.max_schedules,
        )  # fmt: skip
    warnings = fleet.schedule_warnings(found, values)
    return await schedule_reply_off_loop(
        row, status=201, reveal_secret=True, warnings=warnings
    )  # the webhook secret, once


async def list_(call: Call) -> web.StreamResponse:
    """An admin token sees every owner's schedules, or one owner's with ``owner``; any other
    token sees only its owner's (another owner's name finds nothing)."""
    limit: int = call.params["limit"]
    owner: str | None = call.params["owner"]
    if call.scope is not None and owner not in (None, call.scope):
        return json_reply(views.page([], limit))
    rows = await lookups.schedules_page(
        call.deps.pool,
        owner=call.scope or owner,
        enabled=call.params["enabled"],
        name=call.params["name"],
        after_id=int(call.params["cursor"] or 0),
        limit=limit + 1,
    )
    return json_reply(views.page([views.schedule(row) for row in rows], limit))


async def get(call: Call) -> web.StreamResponse:
    row = await lookups.schedule_or_missing(call.deps.pool, call.params["id"], call.scope)
    spend = await budget_ops.schedule_spend(call.deps.pool, row, call.deps.clock)
    data = await offload.run(lambda: views.schedule(row, with_next=True))
    return json_reply({**data, "spend": spend}, headers={"ETag": views.etag(row)})


def _if_match(header: str | None) -> int | None:
    """The version an If-Match header names; None for ``*``; 412 for anything else."""
    if header is None or header.strip() == "*":
        return None
    text = header.strip().removeprefix("W/").strip('"')
    if not text.isascii() or not text.isdigit() or len(text) > 9:
        raise ApiError(412, "precondition_failed", f"If-Match names no version: {header[:40]!r}")
    return int(text)


async def patch(call: Call) -> web.StreamResponse:
    changes = dict(call.body)
    body_version: int | None = changes.pop("version", None)
    header_version = _if_match(call.params["If-Match"])
    if None not in (header_version, body_version) and header_version != body_version:
        raise ValidationError("version", "disagrees with the If-Match header")
    expected = header_version if header_version is not None else body_version
    deps = call.deps
    found = await fleet.current(deps.pool, deps.clock, deps.published)
    try:
        async with deps.pool.acquire() as conn:
            before = await lookups.schedule(conn, call.params["id"], call.scope)
            row = await schedule_ops.update_schedule(
                conn,
                deps.clock,
                call.params["id"],
                changes,
                owner=call.scope,
                actor=call.who.actor,
                expected_version=expected,
                **found.checks(deps.tool_catalog()),
            )
    except errors.VersionConflict as exc:
        if header_version is not None:
            raise ApiError(412, "precondition_failed", str(exc)) from None
        raise
    # A new webhook secret (set or generated) is shown in the response that made it, once.
    rotated = before is not None and views.webhook_secret(before) != views.webhook_secret(row)
    warnings = fleet.schedule_warnings(found, row)
    return await schedule_reply_off_loop(row, reveal_secret=rotated, warnings=warnings)


async def delete(call: Call) -> web.StreamResponse:
    async with call.deps.pool.acquire() as conn:
        await schedule_ops.delete_schedule(
            conn, call.params["id"], owner=call.scope, actor=call.who.actor
        )
    return web.Response(status=204)


_SCHEDULE = Reply("the schedule, with its next 5 fire times", "Schedule", headers=("ETag",))
_MISSING = Reply("no such schedule (or not yours)", "Error")

OPERATIONS = (
    Operation(
        "POST", "/v1/schedules", create, "createSchedule", "Create a schedule", "schedules",
        {"201": Reply("the created schedule and its next 5 fire times", "Schedule",
                      headers=("ETag",)),
         "409": Reply("the owner has PROMPTSCHED_OWNER_MAX_SCHEDULES schedules already (code "
                      "quota_exceeded)", "Error")},
        body="ScheduleCreate",
        description="The schedule belongs to the token's owner and fires from its next slot.",
    ),
    Operation(
        "GET", "/v1/schedules", list_, "listSchedules", "List schedules", "schedules",
        {"200": Reply("one page of schedules, in id order", "SchedulePage")},
        params=(
            Param("enabled", "query", {"type": "boolean"}, description="only (not) paused"),
            Param("name", "query", {"type": "string", "maxLength": inputs.MAX_NAME},
                  description="a case-insensitive substring of the name"),
            Param("owner", "query", {"type": "string", "maxLength": 100},
                  description="only this owner's (an admin token sees every owner's; any "
                  "other token only its own)"),
            CURSOR, LIMIT,
        ),
    ),
    Operation(
        "GET", "/v1/schedules/{id}", get, "getSchedule", "Get a schedule", "schedules",
        {"200": _SCHEDULE, "404": _MISSING}, params=(ID_PARAM,),
    ),
    Operation(
        "PATCH", "/v1/schedules/{id}", patch, "updateSchedule", "Change a schedule", "schedules",
        {"200": _SCHEDULE, "404": _MISSING,
         "409": Reply("the body's version is not the current one", "Error"),
         "412": Reply("If-Match does not name the current version", "Error")},
        params=(ID_PARAM, Param("If-Match", "header", {"type": "string", "maxLength": 100},
                                description='the ETag you read, e.g. "3"')),
        body="SchedulePatch",
        description="A new expression or zone takes effect from the next slot.",
    ),
    Operation(
        "DELETE", "/v1/schedules/{id}", delete, "deleteSchedule", "Delete a schedule",
        "schedules", {"204": Reply("deleted, with its runs"), "404": _MISSING},
        params=(ID_PARAM,),
    ),
)  # fmt: skip
