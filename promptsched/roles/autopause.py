"""Pause after N consecutive dead runs: a schedule that keeps failing stops, says why, and
waits for its owner instead of failing every week forever."""

from __future__ import annotations

from datetime import datetime

import structlog

from promptsched.store import queries

log = structlog.get_logger("autopause")


async def check(db: queries.DB, schedule_id: int, run_id: int, now: datetime | None) -> bool:
    """Call after run ``run_id`` of ``schedule_id`` went dead; True when the schedule was
    paused (and its owner is owed a message saying so)."""
    row = await queries.schedule_pause_if_failing(db, schedule_id)
    if row is None:
        return False
    await queries.schedule_change_insert(
        db, schedule_id, row["owner"], "promptsched", "auto_pause", {"reason": row["pause_reason"]}
    )
    await queries.outbox_insert_paused(db, run_id, schedule_id, now)
    log.warning("schedule.auto_paused", schedule_id=schedule_id, reason=row["pause_reason"])
    return True
