"""Notifications the outbox gave up on (dead letters), and their replay."""

from __future__ import annotations

from aiohttp import web

from promptsched import errors
from promptsched.api.http import (
    CURSOR,
    ID_PARAM,
    LIMIT,
    ApiError,
    Call,
    Operation,
    Reply,
    json_reply,
)
from promptsched.errors import ValidationError
from promptsched.ops import notifications, views


async def list_dead(call: Call) -> web.StreamResponse:
    limit: int = call.params["limit"]
    cursor = call.params["cursor"]
    items = await notifications.list_dead_notifications(
        call.deps.pool, call.scope, before_id=int(cursor) if cursor else None, limit=limit + 1
    )
    return json_reply(views.page(items, limit))


async def replay(call: Call) -> web.StreamResponse:
    notification_id = call.params["id"]
    try:
        replayed = await notifications.replay_notification(
            call.deps.pool, notification_id, call.scope, clock=call.deps.clock
        )
    except ValidationError as exc:  # it exists but is not dead
        raise ApiError(409, "conflict", exc.message) from None
    if replayed is None:
        raise errors.NotFound("notification", notification_id)
    return json_reply(replayed)


OPERATIONS = (
    Operation(
        "GET", "/v1/notifications/dead", list_dead, "listDeadNotifications",
        "Notifications that could not be delivered", "notifications",
        {"200": Reply("one page of dead notifications, newest first", "NotificationPage")},
        params=(CURSOR, LIMIT),
    ),
    Operation(
        "POST", "/v1/notifications/{id}/replay", replay, "replayNotification",
        "Owe a dead notification again", "notifications",
        {"200": Reply("the notification, pending again (to the schedule's current target, "
                      "with the same idempotency key)", "Notification"),
         "404": Reply("no such notification (or not yours)", "Error"),
         "409": Reply("the notification is not dead", "Error")},
        params=(ID_PARAM,),
    ),
)  # fmt: skip
