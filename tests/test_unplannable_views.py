"""A schedule whose fire times this version cannot compute (the scheduler pauses it) still
shows in the API and the console, with why it is paused, instead of breaking the page."""

from __future__ import annotations

from typing import Any

import asyncpg

from tests import api_support
from tests.api_support import SCHEDULE
from tests.console_support import console


async def test_an_unplannable_schedule_still_shows_with_its_pause_reason(
    pool: asyncpg.Pool[Any],
) -> None:
    async with api_support.client(pool) as api:
        who = await api.token("alice")
        good = (await api.post("/v1/schedules", who, json={**SCHEDULE, "name": "good"})).body
        bad = (await api.post("/v1/schedules", who, json={**SCHEDULE, "name": "mars"})).body
        # What the scheduler leaves behind for a zone the installed tzdata no longer has.
        await pool.execute(
            "UPDATE schedules SET timezone = 'Mars/Olympus', enabled = false, "
            "pause_reason = 'paused: its fire times could not be computed' WHERE id = $1",
            bad["id"],
        )
        one = await api.get(f"/v1/schedules/{bad['id']}", who)
        assert one.status == 200, one.body
        assert one.body["next_fire_times"] == []
        assert one.body["pause_reason"] == "paused: its fire times could not be computed"
        listed = await api.get("/v1/schedules", who)
        assert listed.status == 200, listed.body
        assert {s["name"] for s in listed.body["items"]} == {"good", "mars"}
        assert (await api.get(f"/v1/schedules/{good['id']}", who)).body["next_fire_times"]
    async with console(pool) as ui:
        await ui.login_as("alice")
        explain = f"/schedules/{bad['id']}?at=2026-03-02T09:00"
        for path in ("/", f"/schedules/{bad['id']}", f"/schedules/{bad['id']}/edit", explain):
            page = await ui.get(path)
            assert page.status == 200, (path, page.text)
            assert "mars" in page.text, path
        page = await ui.get(f"/schedules/{bad['id']}")
        assert "fire times could not be computed" in page.text
