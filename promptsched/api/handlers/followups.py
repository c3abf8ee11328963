"""Follow-ups: keyed one-shots placed at an application's own event, created and cancelled by
key (docs/followups.md)."""

from __future__ import annotations

from aiohttp import web

from promptsched import errors
from promptsched.api.http import CURSOR, LIMIT, Call, Operation, Param, Reply, json_reply
from promptsched.ops import fleet, followups, schemas, views

OWNER = Param(
    "owner", "query", {"type": "string", "minLength": 1, "maxLength": 100},
    description="whose: an admin token may name any owner (by key: default its own; listing: "
    "default every owner's); any other token only its own",
)  # fmt: skip
KEY_PARAM = Param(
    "key", "path", {"type": "string", "minLength": 1, "maxLength": 200}, required=True,
    description="the follow-up's key, unique per owner",
)  # fmt: skip


async def create(call: Call) -> web.StreamResponse:
    deps = call.deps
    found = await fleet.current(deps.pool, deps.clock, deps.published)
    async with deps.pool.acquire() as conn:
        created, data = await followups.create(
            conn, deps.clock, call.body, owner=call.who.owner, actor=call.who.actor,
            **found.checks(deps.tool_catalog()),
        )  # fmt: skip
    return json_reply(data, status=201 if created else 200)


def _owner(call: Call) -> str:
    """Whose follow-up a key names: the token's owner's, or for an admin token the ``owner``
    named. Another owner's key from any other token is simply not found (no such key of its
    owner), as everywhere else."""
    named: str | None = call.params["owner"]
    if named is None or call.scope is not None:
        if named not in (None, call.who.owner):
            raise errors.NotFound("follow-up", call.params["key"])
        return call.who.owner
    return named


async def get(call: Call) -> web.StreamResponse:
    return json_reply(await followups.show(call.deps.pool, _owner(call), call.params["key"]))


async def list_(call: Call) -> web.StreamResponse:
    """An admin token lists every owner's follow-ups, or one owner's with ``owner``; any other
    token only its owner's (another owner's name finds nothing)."""
    limit: int = call.params["limit"]
    cursor = call.params["cursor"]
    named: str | None = call.params["owner"]
    if call.scope is not None and named not in (None, call.scope):
        return json_reply(views.page([], limit, key="schedule_id"))
    items = await followups.list_(
        call.deps.pool, call.scope or named, call.params["state"],
        before_id=int(cursor) if cursor else None, limit=limit + 1,
    )  # fmt: skip
    return json_reply(views.page(items, limit, key="schedule_id"))


async def list_runs(call: Call) -> web.StreamResponse:
    limit: int = call.params["limit"]
    cursor = call.params["cursor"]
    items = await followups.runs(
        call.deps.pool, _owner(call), call.params["key"], call.params["status"],
        before_id=int(cursor) if cursor else None, limit=limit + 1,
    )  # fmt: skip
    return json_reply(views.page(items, limit))


async def cancel(call: Call) -> web.StreamResponse:
    async with call.deps.pool.acquire() as conn:
        await followups.cancel(
            conn, _owner(call), call.params["key"], actor=call.who.actor, clock=call.deps.clock
        )
    return web.Response(status=204)


_FOLLOWUP = Reply("the follow-up with its checks (decisions) and runs", "Followup")
_MISSING = Reply("no follow-up with this key (or not yours)", "Error")

OPERATIONS = (
    Operation(
        "POST", "/v1/followups", create, "createFollowup", "Place a follow-up by key",
        "followups",
        {"201": Reply("created", "Followup"),
         "200": Reply("the key exists with the same body: the existing follow-up", "Followup"),
         "409": Reply("the key exists with a different body (the message says what differs)",
                      "Error")},
        body="FollowupCreate",
        description="A one-shot check `in` a delay or `at` an instant, that may ask to be "
        "checked again (docs/followups.md). Idempotent by key.",
    ),
    Operation(
        "GET", "/v1/followups", list_, "listFollowups", "List follow-ups", "followups",
        {"200": Reply("one page of the owner's follow-ups, newest first", "FollowupPage")},
        params=(Param("state", "query", {"type": "string", "enum": list(followups.STATES)}),
                OWNER, CURSOR, LIMIT),
    ),
    Operation(
        "GET", "/v1/followups/{key}", get, "getFollowup", "Get a follow-up by key",
        "followups", {"200": _FOLLOWUP, "404": _MISSING}, params=(KEY_PARAM, OWNER),
    ),
    Operation(
        "GET", "/v1/followups/{key}/runs", list_runs, "listFollowupRuns",
        "List a follow-up's runs by key", "followups",
        {"200": Reply("one page of the follow-up's runs (its checks), newest first", "RunPage"),
         "404": _MISSING},
        params=(KEY_PARAM, Param("status", "query",
                                 {"type": "string", "enum": list(schemas.RUN_STATUSES)}),
                OWNER, CURSOR, LIMIT),
    ),
    Operation(
        "DELETE", "/v1/followups/{key}", cancel, "cancelFollowup", "Cancel a follow-up by key",
        "followups",
        {"204": Reply("cancelled (again: nothing changes)"), "404": _MISSING},
        params=(KEY_PARAM, OWNER),
        description="No further check starts; a pending check is cancelled and a running one "
        "is asked to stop. Its history stays.",
    ),
)  # fmt: skip
