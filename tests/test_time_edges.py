"""Time edge cases a newcomer met: `explain` at a local time a DST gap skipped names the real
fire time (API, CLI in a real process, console); a pause with an end skips the slots inside
it (reason `paused`), fires the first slot after it, and says when it resumes; a past `at` is
refused as past; a one-shot that fired shows as done."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.config import SchedulerSettings
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
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


T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


async def _rows(pool: asyncpg.Pool[Any], sid: int) -> list[tuple[str, str, str | None]]:
    rows = await pool.fetch(
        "SELECT slot, status, skip_reason FROM runs WHERE schedule_id = $1 ORDER BY slot", sid
    )
    return [(f"{r['slot']:%H:%M:%S}", r["status"], r["skip_reason"]) for r in rows]


async def test_a_pause_with_an_end_skips_its_slots_and_fires_the_first_after_it(
    pool: asyncpg.Pool[Any], dsn: str
) -> None:
    """`schedules pause ticker --until +1min` on 15,45 * * * * *: the two slots inside the
    pause are skipped (reason paused), none runs late at the resume, and 10:01:15, the first
    slot after it, runs on time (not skipped as an overlap of a catch-up run)."""
    sid = await factories.schedule(
        pool, name="ticker", expression="15,45 * * * * *", next_fire_at=T0 + timedelta(seconds=15)
    )
    paused_at = T0 + timedelta(seconds=5)
    done = run_cli("schedules", "pause", "ticker", "--until", "2026-03-02T10:01:05Z", dsn=dsn,
                   env={"PROMPTSCHED_CLI_NOW": paused_at.isoformat()})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "schedule 1 'ticker': cron 15,45 * * * * * (UTC), paused until 2026-03-02 10:01:05 UTC "
        "(in 1 min), next fire: 2026-03-02 10:01:15 UTC (in 1 min), the first slot after the "
        "pause\n"
    ).replace("schedule 1 ", f"schedule {sid} ")
    clock = FrozenClock(T0 + timedelta(seconds=66))
    scheduler = Scheduler(pool, clock, Metrics(), SchedulerSettings())
    assert await scheduler.resume_due() == 1
    await scheduler.run_once()
    assert await _rows(pool, sid) == [
        ("10:00:15", "skipped", "paused"), ("10:00:45", "skipped", "paused"),
    ]  # fmt: skip
    row = await pool.fetchrow("SELECT enabled, paused_until, next_fire_at FROM schedules")
    assert (row["enabled"], row["paused_until"]) == (True, None)
    assert row["next_fire_at"] == T0 + timedelta(minutes=1, seconds=15)
    history = await pool.fetchrow(
        "SELECT actor, action, changes FROM schedule_changes WHERE schedule_id = $1 "
        "ORDER BY id DESC LIMIT 1", sid,
    )  # fmt: skip
    assert dict(history) == {"actor": "promptsched", "action": "auto_resume",
                             "changes": {"skipped": 2}}  # fmt: skip
    clock.set(T0 + timedelta(minutes=1, seconds=15))  # nothing ran meanwhile: no overlap
    await scheduler.run_once()
    assert (await _rows(pool, sid))[-1] == ("10:01:15", "pending", None)
    explained = run_cli("schedules", "explain", "ticker", "--at", "2026-03-02T10:00:45",
                        "--json", dsn=dsn)  # fmt: skip
    assert '"verdict": "skipped"' in explained.stdout and "inside a pause" in explained.stdout


async def test_a_past_at_is_refused_as_past(api: Api, dsn: str) -> None:
    done = run_cli("schedules", "add", "--name", "once", "--at", "2020-01-01T00:00:00Z",
                   "--prompt", "p", dsn=dsn)  # fmt: skip
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.splitlines()[-1] == (
        "promptsched: error: at: that time is past (2020-01-01 00:00:00 UTC); give one in the "
        "future"
    )
    body = {"name": "once", "at": "2020-01-01T09:00:00", "timezone": "Europe/Paris", "prompt": "p"}
    reply = await api.post("/v1/schedules", await api.token("alice"), json=body)
    assert reply.status == 422 and reply.body["error"]["field"] == "at"
    assert reply.body["error"]["message"].startswith("that time is past (2020-01-01 09:00:00 CET)")


async def test_a_one_shot_that_fired_shows_as_done(
    pool: asyncpg.Pool[Any], dsn: str, ui: Console
) -> None:
    sid = await factories.schedule(pool, name="once", kind="at", expression="2026-03-02T09:00:00Z")
    await pool.execute("UPDATE schedules SET owner = 'alice' WHERE id = $1", sid)  # cursor: none
    shown = run_cli("schedules", "show", "once", dsn=dsn).stdout
    assert "state                 done (fired once)" in shown, shown
    listed = run_cli("schedules", "list", dsn=dsn).stdout
    assert listed.splitlines()[1].split()[6:8] == ["done", "-"], listed
    await ui.login_as("alice")
    for path in ("/", f"/schedules/{sid}"):
        page = await ui.get(path)
        assert 'class="badge st-done">done (fired once)</span>' in page.text, path
