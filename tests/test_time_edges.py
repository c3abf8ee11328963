"""Time edge cases a newcomer met: `explain` at a local time a DST gap skipped names the real
fire time (API, CLI in a real process, console); a pause with an end skips the slots inside
it (reason `paused`), fires the first slot after it, and says when it resumes; a past `at` is
refused as past; a one-shot that fired shows as done."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from tests import factories
from tests.api_support import Api
from tests.console_support import Console, console
from tests.helpers import run_cli

GAP_DAY_FIRE = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 03:00 EDT, right after 02:00 EST


@pytest.fixture
async def ui(pool: asyncpg.Pool[Any]) -> AsyncIterator[Console]:
    async with console(pool) as client:
        yield client


async def _gap_schedule(pool: asyncpg.Pool[Any]) -> tuple[int, int]:
    """Alice's 02:30 New York schedule, created in February, and its run of the spring-forward
    night: the slot fired at 03:00 EDT, the first instant after the gap (dst_gap shift)."""
    sid = await factories.schedule(
        pool, name="nightly", expression="30 2 * * *", timezone="America/New_York"
    )
    await pool.execute(
        "UPDATE schedules SET owner = 'alice', created_at = '2026-02-01T00:00:00Z' WHERE id = $1",
        sid,
    )
    run = await factories.pending_run(pool, sid, GAP_DAY_FIRE)
    await pool.execute(
        "UPDATE runs SET status = 'succeeded', attempts = 1, finished_at = slot WHERE id = $1", run
    )
    return sid, run


async def test_explain_at_a_local_time_dst_skipped_names_the_real_fire_time(
    pool: asyncpg.Pool[Any], api: Api, dsn: str, ui: Console
) -> None:
    sid, run = await _gap_schedule(pool)
    alice = await api.token("alice")
    reply = await api.get(f"/v1/schedules/{sid}/explain?at=2026-03-08T02:30", alice)
    assert reply.status == 200, reply.body
    assert reply.body["at"] == GAP_DAY_FIRE.isoformat()
    assert (reply.body["verdict"], [r["id"] for r in reply.body["runs"]]) == ("ran", [run])
    note = (
        "02:30 did not exist on 2026-03-08 in America/New_York (DST): a slot due then fires at "
        "2026-03-08 03:00 EDT, the first instant after the gap."
    )
    assert reply.body["message"].startswith(note), reply.body["message"]
    # The same from a real CLI process, and in the console.
    done = run_cli("schedules", "explain", "nightly", "--at", "2026-03-08T02:30", dsn=dsn)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()[:2]
    assert first.startswith("2026-03-08 03:00 EDT (") and first.endswith("): ran"), first
    assert second.strip().startswith(note), second
    await ui.login_as("alice")
    page = await ui.get(f"/schedules/{sid}?at=2026-03-08T02%3A30")
    assert page.status == 200 and note in page.text
    # A repeated local time (fall back) is read as its first occurrence, and says so.
    fold = await api.get(f"/v1/schedules/{sid}/explain?at=2026-11-01T01:30", alice)
    assert fold.body["at"] == "2026-11-01T05:30:00+00:00"
    assert "01:30 occurred twice on 2026-11-01" in fold.body["message"]
    # An instant with its offset is taken as given.
    given = await api.get(f"/v1/schedules/{sid}/explain?at=2026-03-08T07:30:00Z", alice)
    assert given.body["at"] == "2026-03-08T07:30:00+00:00" and "DST" not in given.body["message"]
