"""Notification operations the CLI and the HTTP API call: list dead notifications, list a
run's notifications, and replay a dead one (it is owed again, as the same message)."""

from __future__ import annotations

from typing import Any

import structlog

from promptsched.clock import Clock
from promptsched.errors import ValidationError
from promptsched.ops import views
from promptsched.store import queries

log = structlog.get_logger("notifications")


async def list_dead_notifications(
    db: queries.DB, owner: str | None, *, before_id: int | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The owner's dead notifications, newest first (``owner=None``: everyone's, for admins);
    page with ``before_id`` = the last id seen."""
    if not 1 <= limit <= 1000:
        raise ValidationError("limit", f"must be between 1 and 1000, got {limit}")
    rows = await queries.outbox_list_dead(db, owner, before_id, limit)
    return [views.notification_json(row) for row in rows]


async def list_run_notifications(
    db: queries.DB, run_id: int, owner: str | None
) -> list[dict[str, Any]]:
    """Every notification a run owes or owed, with its delivery status."""
    return [
        views.notification_json(row) for row in await queries.outbox_list_for_run(db, run_id, owner)
    ]


async def replay_notification(
    db: queries.DB, notification_id: int, owner: str | None, *, clock: Clock | None = None
) -> dict[str, Any] | None:
    """Owe a dead notification again with fresh attempts, to the schedule's current target.

    None when the owner has no such notification (a 404); ValidationError naming ``id`` when
    it is not dead (a 409: only dead notifications are replayed).
    """
    now = (clock or Clock()).sql_now()
    row = await queries.outbox_replay(db, now, notification_id, owner)
    if row is None:
        current = await queries.outbox_get(db, notification_id, owner)
        if current is None:
            return None
        raise ValidationError(
            "id",
            f"notification {notification_id} is {current['status']}; "
            "only dead notifications can be replayed",
        )
    log.info(
        "notification.replayed",
        notification_id=notification_id,
        run_id=row["run_id"],
        channel=row["channel"],
    )
    return views.notification_json(row)
