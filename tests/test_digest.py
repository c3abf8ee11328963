"""Owners hear about what they lose: the ticks a schedule dropped in a period (overlap skips,
misfire drops, catch-up window, budget skips) reach its failure targets as one digest per
period and channel, with the count by reason, never one message per tick. Real Postgres, a
real scheduler, SMTP server and HTTP sink; time moves by a frozen clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from promptsched.clock import FrozenClock
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from promptsched.store import queries
from tests.factories import EPOCH
from tests.fakes.http_sink import HttpSink
from tests.fakes.smtp import FakeSMTP
from tests.test_notifier import make_notifier, notified_schedule, outbox, smtp  # noqa: F401

HOUR = timedelta(hours=1)
PERIOD_START = EPOCH.replace(minute=0, second=0, microsecond=0) + HOUR


async def dropped_row(
    pool: asyncpg.Pool[Any], sid: int, at: Any, status: str, reason: str | None, missed: int
) -> None:
    """A run row as the scheduler or a worker stores a tick it did not run (``missed`` other
    slots folded into it), finished at ``at``."""
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, status, skip_reason, missed_slots, "
        "provider, max_attempts, available_at, finished_at) "
        "VALUES ($1, $2, 'cadence', $3, $4, $5, 'echo', 3, $2, $2)",
        sid, at, status, reason, missed,
    )  # fmt: skip


async def test_fifty_dropped_ticks_in_a_period_send_one_digest_by_reason(
    pool: asyncpg.Pool[Any],
    smtp: FakeSMTP,  # noqa: F811
    sink: HttpSink,
) -> None:
    sid = await notified_schedule(
        pool, email=["owner@example.com"], webhook=sink.url, on_success=False,
        expression="* * * * *", next_fire_at=PERIOD_START,
    )  # fmt: skip
    # A run that never finishes: every following minute is an overlap skip, written by the
    # real scheduler, one tick at a time.
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "VALUES ($1, $2::timestamptz, 'manual', 'echo', 3, $2::timestamptz + interval '1 day')",
        sid, PERIOD_START - timedelta(minutes=5),
    )  # fmt: skip
    clock = FrozenClock(PERIOD_START)
    scheduler = Scheduler(pool, clock, Metrics())
    for minute in range(30):
        clock.set(PERIOD_START + timedelta(minutes=minute, seconds=1))
        await scheduler.run_once()
    overlap = await pool.fetchval(
        "SELECT count(*) FROM runs WHERE schedule_id = $1 AND skip_reason = 'overlap'", sid
    )
    assert overlap == 30
    # The other ways a tick is lost in the same period: a misfire skip standing for 12 slots,
    # a run that started for the latest late slot with 5 folded into it (run_once), a catch-up
    # window skip for 2 and a budget skip (issue 19's reason: any reason counts) for 1.
    at = PERIOD_START + timedelta(minutes=40)
    await dropped_row(pool, sid, at, "skipped", "misfire", 11)
    await dropped_row(pool, sid, at + timedelta(minutes=1), "succeeded", None, 5)
    await dropped_row(pool, sid, at + timedelta(minutes=2), "skipped", "catchup_window", 1)
    await dropped_row(pool, sid, at + timedelta(minutes=3), "skipped", "budget", 0)
    # Not losses: a tick skipped while the schedule was paused, and a drop in the next period.
    await dropped_row(pool, sid, at + timedelta(minutes=4), "skipped", "disabled", 0)
    await dropped_row(
        pool, sid, PERIOD_START + HOUR + timedelta(minutes=1), "skipped", "overlap", 0
    )

    notifier = make_notifier(pool, clock, smtp)
    try:
        # Within the period nothing is owed yet: the digest waits for the period to end.
        clock.set(PERIOD_START + timedelta(minutes=59))
        assert "digests_owed" not in await notifier.run_once()
        clock.set(PERIOD_START + HOUR + timedelta(minutes=2))
        counts = await notifier.run_once()
        assert counts["digests_owed"] == 2 and counts["sent"] == 2  # email and webhook
        # However often any notifier looks again in this period, nothing more is owed.
        for _ in range(3):
            assert await notifier.run_once() == {}
        again = await queries.outbox_owe_digests(pool, clock.sql_now(), HOUR)
        assert again["owed"] == 0 and again["seconds_to_next"] == 58 * 60  # the next period
    finally:
        await notifier.aclose()

    digests = [row for row in await outbox(pool) if row["event"] == "digest"]
    assert sorted(row["channel"] for row in digests) == ["email", "webhook"]
    expected = {"overlap": 30, "misfire": 17, "catchup_window": 2, "budget": 1}
    assert sum(expected.values()) == 50
    for row in digests:
        assert row["details"]["dropped"] == expected and row["details"]["total"] == 50
    [mail] = smtp.received
    assert str(mail.message["Subject"]) == "[promptsched] test: DROPPED 50 ticks"
    text = mail.message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    for line in ("- overlap: 30 slots", "- misfire: 17 slots", "- catchup_window: 2 slots",
                 "- budget: 1 slot (the budget was used up)"):  # fmt: skip
        assert line in text, text
    assert f"promptsched schedules edit {sid}" in text
    [hook] = [request.json() for request in sink.requests]
    assert hook["event"] == "schedule.digest"
    assert hook["digest"]["dropped"] == expected and hook["digest"]["total"] == 50


async def test_a_schedule_that_dropped_nothing_or_notifies_nobody_owes_no_digest(
    pool: asyncpg.Pool[Any],
    smtp: FakeSMTP,  # noqa: F811
) -> None:
    quiet = await notified_schedule(pool, email=["a@example.com"])
    only_success = await notified_schedule(pool, email=["b@example.com"], on_failure=False)
    silent = await notified_schedule(pool)
    at = PERIOD_START + timedelta(minutes=10)
    for sid in (only_success, silent):
        await dropped_row(pool, sid, at, "skipped", "overlap", 0)
    await dropped_row(pool, quiet, at, "succeeded", None, 0)
    assert (await queries.outbox_owe_digests(pool, PERIOD_START + HOUR, HOUR))["owed"] == 0
    assert await outbox(pool) == []
