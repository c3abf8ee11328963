"""Hostile schedule expressions against the real API on loopback: each is rejected (422 naming
the field) or answered within a fixed bound by POST /v1/schedules, GET /v1/preview and
explain, while a /healthz probe on the same event loop keeps answering in under 200 ms; and
a stored schedule that can no longer be planned within the budget is paused, not retried."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg

from promptsched.clock import FrozenClock
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from tests.api_support import SCHEDULE, Api

BOUND = 8.0  # seconds for the three requests of one expression (each does far less)
HEALTHZ = 0.2
_DT = "DTSTART:20260101T000000\n"
CORPUS: list[tuple[str, str, str]] = [  # kind, expression, timezone
    # sparse day filters at the finest FREQs (the 95-second rule of the report, and kin)
    ("rrule", _DT + "RRULE:FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYSETPOS=1", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYSETPOS=2", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=12", "UTC"),
    (
        "rrule",
        _DT + "RRULE:FREQ=SECONDLY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=12",
        "UTC",
    ),
    ("rrule", _DT + "RRULE:FREQ=SECONDLY;INTERVAL=7;BYMONTH=2;BYMONTHDAY=-1;BYDAY=SU", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=MINUTELY;INTERVAL=7;BYMONTH=2;BYMONTHDAY=29;BYHOUR=3", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=MINUTELY;BYSETPOS=-1;BYMONTHDAY=31;BYDAY=FR;BYMONTH=5", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=SECONDLY;BYYEARDAY=366;BYDAY=TU;BYHOUR=23", "Pacific/Kiritimati"),
    ("rrule", _DT + "RRULE:FREQ=HOURLY;INTERVAL=5;BYWEEKNO=53;BYDAY=TH;BYMONTH=12", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=SECONDLY;BYSETPOS=2", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=MINUTELY;INTERVAL=120;BYHOUR=1", "UTC"),
    # far-future DTSTART, huge INTERVAL, COUNT on rules that never fire
    ("rrule", "DTSTART:46920101T000000\nRRULE:FREQ=SECONDLY", "UTC"),
    ("rrule", "DTSTART:21991231T235959\nRRULE:FREQ=YEARLY", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=SECONDLY;INTERVAL=10000;BYHOUR=5;BYMINUTE=0", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=YEARLY;INTERVAL=99999999999999999999", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=YEARLY;INTERVAL=400;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO", "UTC"),
    (
        "rrule",
        _DT + "RRULE:FREQ=SECONDLY;COUNT=5;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYSETPOS=2",
        "UTC",
    ),
    ("rrule", _DT + "RRULE:FREQ=MINUTELY;COUNT=3;INTERVAL=120;BYHOUR=1", "UTC"),
    ("rrule", _DT + "RRULE:FREQ=MINUTELY;INTERVAL=7;COUNT=100000;BYHOUR=12", "UTC"),
    # non-ASCII digits
    ("cron", "¹ * * * *", "UTC"),
    ("cron", "0 ٩ * * *", "UTC"),
    ("cron", "*/² * * * * *", "UTC"),
    ("rrule", "RRULE:FREQ=DAILY;INTERVAL=¹", "UTC"),
    ("rrule", "RRULE:FREQ=DAILY;COUNT=٣", "UTC"),
    # far-future one-shots and intervals; zones that are not IANA names
    ("at", "4692-01-01T00:00", "UTC"),
    ("at", "2199-12-31T23:59:59Z", "UTC"),
    ("every", "1s from 9999-12-31T23:59:58Z", "UTC"),
    ("cron", "0 0 29 2 1", "UTC"),
    ("cron", "0 9 * * *", ""),
    ("cron", "0 9 * * *", "localtime"),
    ("cron", "0 9 * * *", "Factory"),
]


async def _one(api: Api, who: dict[str, str], kind: str, expression: str, zone: str) -> None:
    body = {**SCHEDULE, "cron": None, "kind": kind, "expression": expression, "timezone": zone}
    created = await api.post("/v1/schedules", who, json={**body, "name": expression[:100]})
    assert created.status in (201, 422), (expression, created.body)
    if created.status == 422:
        assert created.body["error"]["field"] in ("expression", "timezone"), created.body
    else:
        assert all(t < "2200" for t in created.body["next_fire_times"]), created.body
        sid = created.body["id"]
        for at in ("2030-01-01T00:00:00Z", "2199-12-31T23:59:59Z"):
            explained = await api.get(f"/v1/schedules/{sid}/explain", who, params={"at": at})
            assert explained.status in (200, 422), explained.body
    params = {"expression": expression, "kind": kind, "timezone": zone, "count": "100"}
    previewed = await api.get("/v1/preview", who, params={**params, "from": "2026-11-23T00:00:00Z"})
    assert previewed.status in (200, 422), (expression, previewed.body)
    if previewed.status == 200:
        assert all(t["utc"] < "2200" for t in previewed.body["fire_times"]), previewed.body
    else:
        assert previewed.body["error"]["field"] in ("expression", "timezone"), previewed.body


async def test_hostile_expressions_are_bounded_and_healthz_keeps_answering(
    api: Api,
) -> None:
    who = await api.token("mallory")
    latencies: list[float] = []
    slowest: list[tuple[float, str]] = []
    done = anyio.Event()

    async def probe() -> None:
        while not done.is_set():
            started = time.monotonic()
            async with api.client.get("/healthz") as reply:
                assert reply.status == 200
            latencies.append(time.monotonic() - started)
            with anyio.move_on_after(0.02):  # the probe's period, not a wait for a condition
                await done.wait()

    async def attack(slots: anyio.Semaphore, kind: str, expression: str, zone: str) -> None:
        async with slots:
            started = time.monotonic()
            with anyio.fail_after(BOUND):
                await _one(api, who, kind, expression, zone)
            slowest.append((time.monotonic() - started, expression))

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe)
        slots = anyio.Semaphore(4)  # four hostile clients at once
        async with anyio.create_task_group() as burst:
            for kind, expression, zone in CORPUS:
                burst.start_soon(attack, slots, kind, expression, zone)
        done.set()
    assert len(slowest) == len(CORPUS)
    assert len(latencies) > 10, "the probe must have run throughout the burst"
    assert max(latencies) < HEALTHZ, (max(latencies), sorted(slowest)[-3:])


async def test_a_stored_schedule_beyond_the_budget_is_paused_with_its_reason(
    api: Api, pool: asyncpg.Pool[Any]
) -> None:
    # A row an older version accepted: a rule that now needs more than the search budget.
    who = await api.token("alice")
    created = await api.post("/v1/schedules", who, json=SCHEDULE)
    sid = created.body["id"]
    sparse = _DT + "RRULE:FREQ=SECONDLY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=12"
    now = datetime(2026, 11, 23, 9, tzinfo=UTC)
    await pool.execute(
        "UPDATE schedules SET kind = 'rrule', expression = $2, next_fire_at = $3 WHERE id = $1",
        sid,
        sparse,
        now - timedelta(minutes=1),
    )
    scheduler = Scheduler(pool, FrozenClock(now), Metrics())
    started = time.monotonic()
    with anyio.fail_after(BOUND):
        await scheduler.run_once()
    assert time.monotonic() - started < BOUND
    row = await pool.fetchrow("SELECT enabled, pause_reason FROM schedules WHERE id = $1", sid)
    assert row is not None and row["enabled"] is False
    assert "fires less than once in" in row["pause_reason"]
