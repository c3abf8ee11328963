"""Pause after N consecutive dead runs: a schedule that keeps failing stops, says why, and
waits for its owner instead of failing every week forever."""

from __future__ import annotations

from datetime import datetime

import structlog

from promptsched.store import queries

log = structlog.get_logger("autopause")


async def check(db: queries.DB, schedule_id: int, run_id: int, now: datetime | None) -> bool:
    """Call after run ``run_id`` of ``schedule_id`` went dead; True when the schedule was
    paused. The pause, its history row and the message owed to the owner are one statement
    (schedule_pause_if_failing), so a crash leaves all three or none."""
    row = await queries.schedule_pause_if_failing(db, schedule_id, run_id, now)
    if row is None:
        return False
    log.warning(
        "schedule.auto_paused",
        schedule_id=schedule_id,
        run_id=run_id,
        reason=row["pause_reason"],
        notifications=row["owed"],
    )
    return True
