"""Budgets (issue 19, part 4): a run that would start while its schedule or its owner has
reached a limit for the UTC day or month is not sent; it ends ``skipped`` with reason
``budget``, the owner hears once per period through the outbox, and the next period runs
again. Real Postgres, the real scheduler, worker, notifier and an SMTP server; ``echo``
reports words as tokens, so every amount is known in advance; time moves by a frozen clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.clock import Clock, FrozenClock
from promptsched.metrics import Metrics
from promptsched.prices import Prices
from promptsched.roles.scheduler import Scheduler
from tests import factories
from tests.api_support import Api, snapshot
from tests.fakes.smtp import FakeSMTP
from tests.test_notifier import make_notifier, notified_schedule, smtp  # noqa: F401

# "a b c d e" -> 5 prompt tokens; "echo: a b c d e" -> 6 completion tokens: 11 a run.
PROMPT = "a b c d e"
PER_RUN = 11
DAY_ONE = datetime.fromisoformat("2026-03-02T23:50:00+00:00")
MINUTE = timedelta(minutes=1)


async def _statuses(pool: asyncpg.Pool[Any], sid: int) -> list[tuple[str, str | None]]:
    rows = await pool.fetch(
        "SELECT status, skip_reason FROM runs WHERE schedule_id = $1 ORDER BY slot", sid
    )
    return [(row["status"], row["skip_reason"]) for row in rows]


async def test_a_schedule_over_its_daily_budget_skips_and_says_so_once_a_day(
    pool: asyncpg.Pool[Any],
    smtp: FakeSMTP,  # noqa: F811
) -> None:
    sid = await notified_schedule(
        pool, email=["owner@example.com"], on_success=False, expression="* * * * *",
        prompt=PROMPT, next_fire_at=DAY_ONE,
    )  # fmt: skip
    # 30 tokens a day: the third run starts at 22 spent, then 33 >= 30 stops the rest.
    await pool.execute(
        """UPDATE schedules SET budget = '{"tokens_per_day": 30}' WHERE id = $1""", sid
    )
    clock = FrozenClock(DAY_ONE)
    metrics = Metrics()
    scheduler = Scheduler(pool, clock, metrics)
    worker = factories.worker_pool(pool, clock, metrics)
    notifier = make_notifier(pool, clock, smtp)
    try:
        # 23:50 .. 00:09: ten minutes of day one, ten of day two, one slot a minute.
        for minute in range(20):
            clock.set(DAY_ONE + minute * MINUTE + timedelta(seconds=1))
            await scheduler.run_once()
            await worker.run_once()
            await notifier.run_once(digests=False)
    finally:
        await notifier.aclose()
    statuses = await _statuses(pool, sid)
    ran, over = ("succeeded", None), ("skipped", "budget")
    assert statuses == [ran] * 3 + [over] * 7 + [ran] * 3 + [over] * 7
    # Skipped runs were never sent: no attempt used a token, and the error says why.
    skipped = await pool.fetch(
        "SELECT tokens, error FROM runs WHERE schedule_id = $1 AND skip_reason = 'budget' "
        "ORDER BY slot",
        sid,
    )
    assert all(row["tokens"] == 0 for row in skipped)
    assert skipped[0]["error"] == (
        "not sent: the schedule's daily budget of 30 tokens is reached "
        "(33 tokens spent since 2026-03-02 00:00 UTC)"
    )
    spent = await pool.fetchval("SELECT sum(tokens) FROM runs WHERE schedule_id = $1", sid)
    assert spent == 6 * PER_RUN
    # One notice per period, however many runs it skipped; each mail says what was reached.
    notices = await pool.fetch(
        "SELECT idempotency_key, status, details FROM outbox WHERE event = 'budget' ORDER BY id"
    )
    assert [row["idempotency_key"] for row in notices] == [
        f"promptsched-budget-schedule-{sid}-day-2026-03-02-email",
        f"promptsched-budget-schedule-{sid}-day-2026-03-03-email",
    ]
    assert {row["status"] for row in notices} == {"sent"}
    assert [n["details"]["spent"] for n in notices] == [33, 33]
    assert len(smtp.received) == 2
    mail = smtp.received[0].message
    assert "reached its BUDGET" in mail["Subject"]
    text = mail.get_body(("plain",)).get_content()
    assert "the schedule's daily budget of 30 tokens is reached" in text
    assert "runs start again at 2026-03-03 00:00 UTC" in text
    assert (
        metrics.registry.get_sample_value("promptsched_dropped_ticks_total", {"reason": "budget"})
        == 14
    )


async def test_an_owner_budget_holds_over_all_its_schedules(
    pool: asyncpg.Pool[Any], api: Api
) -> None:
    alice, admin = await api.token("alice"), await api.token("root", admin=True)
    set_ = await api.put("/v1/budget", alice, json={"cost_per_month": 0.03})
    assert set_.status == 200, set_.body
    assert set_.body["budget"] == {"cost_per_month": 0.03}
    sids = []
    for i in range(2):
        body = {"name": f"n{i}", "cron": "0 9 * * *", "prompt": PROMPT,
                "notify": {"email": ["alice@example.com"]}}  # fmt: skip
        created = await api.post("/v1/schedules", alice, json=body)
        assert created.status == 201, created.body
        sids.append(created.body["id"])
    # Priced at 1,000 per million tokens each way: 0.011 a run. Two runs spend 0.022, the
    # third starts at 0.022 < 0.03 and brings it to 0.033; after that, either schedule skips.
    worker = factories.worker_pool(pool, Clock(), prices=Prices.parse("echo=1000/1000"))
    now = await pool.fetchval("SELECT now()")
    order = [sids[0], sids[1], sids[0], sids[1], sids[0]]
    runs = []
    for sid in order:  # one at a time: the budget is read at each claim
        runs.append(await factories.pending_run(pool, sid, now, "manual"))
        assert await worker.run_once() == 1
    got = [(r["status"], r["skip_reason"]) for r in
           [await factories.run_row(pool, rid) for rid in runs]]  # fmt: skip
    assert got == [("succeeded", None)] * 3 + [("skipped", "budget")] * 2
    # Both schedules' skips are the owner's one notice of the month.
    notices = await pool.fetch("SELECT run_id, details FROM outbox WHERE event = 'budget'")
    assert [(n["run_id"], n["details"]["scope"]) for n in notices] == [(runs[3], "owner")]
    error = (await factories.run_row(pool, runs[3]))["error"]
    assert "the owner's monthly budget of 0.03 is reached (0.03 spent" in error
    shown = await api.get("/v1/budget", alice)
    assert shown.status == 200, shown.body
    assert shown.body["spend"]["month"]["cost"] == pytest.approx(0.033)
    [limit] = shown.body["spend"]["budget"]
    assert (limit["limit"], limit["allowed"], limit["reached"]) == ("cost_per_month", 0.03, True)
    # Another owner's budget: only an admin may read or set it.
    assert (await api.get("/v1/budget?owner=alice", await api.token("bob"))).status == 403
    by_admin = await api.get("/v1/budget?owner=alice", admin)
    assert by_admin.status == 200 and by_admin.body["owner"] == "alice"
    # Raised, the next run goes; removed ({}), there is no budget at all.
    assert (await api.put("/v1/budget", alice, json={"cost_per_month": 1})).status == 200
    extra = await factories.pending_run(pool, sids[1], now, "manual")
    assert await worker.run_once() == 1
    assert (await factories.run_row(pool, extra))["status"] == "succeeded"
    cleared = await api.put("/v1/budget?owner=alice", admin, json={})
    assert cleared.status == 200 and cleared.body["budget"] is None
    assert await pool.fetchval("SELECT count(*) FROM owner_budgets") == 0


async def test_a_schedule_budget_is_set_shown_and_checked_through_the_api(
    pool: asyncpg.Pool[Any], api: Api
) -> None:
    alice = await api.token("alice")
    body = {"name": "n", "cron": "0 9 * * *", "prompt": PROMPT,
            "budget": {"tokens_per_day": 100, "cost_per_month": 2.5}}  # fmt: skip
    created = await api.post("/v1/schedules", alice, json=body)
    assert created.status == 201, created.body
    sid = created.body["id"]
    assert created.body["budget"] == {"tokens_per_day": 100, "cost_per_month": 2.5}
    rid = await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")
    assert await factories.worker_pool(pool, Clock()).run_once() == 1
    assert (await factories.run_row(pool, rid))["status"] == "succeeded"
    shown = await api.get(f"/v1/schedules/{sid}", alice)
    assert shown.body["spend"]["budget"] == [
        {"limit": "tokens_per_day", "allowed": 100, "spent": PER_RUN, "reached": False},
        {"limit": "cost_per_month", "allowed": 2.5, "spent": 0, "reached": False},
    ]
    # Bad limits name their field, and change nothing.
    before = await snapshot(pool)
    bad = [
        ({"tokens_per_day": "lots"}, "budget.tokens_per_day"),
        ({"tokens_per_day": 1.5}, "budget.tokens_per_day"),
        ({"cost_per_day": -1}, "budget.cost_per_day"),
        ({"per_week": 10}, "budget.per_week"),
        ("10 dollars", "budget"),
    ]
    for budget, field in bad:
        reply = await api.patch(f"/v1/schedules/{sid}", alice, json={"budget": budget})
        assert reply.status == 422, (budget, reply.body)
        assert reply.body["error"]["field"] == field, (budget, reply.body)
        owner = await api.put("/v1/budget", alice, json={"cost_per_day": "x"})
        assert owner.status == 422 and owner.body["error"]["field"] == "cost_per_day"
    assert await snapshot(pool) == before
    # A patch replaces the budget; null removes it.
    patched = await api.patch(f"/v1/schedules/{sid}", alice, json={"budget": {"cost_per_day": 1}})
    assert patched.status == 200 and patched.body["budget"] == {"cost_per_day": 1}
    removed = await api.patch(f"/v1/schedules/{sid}", alice, json={"budget": None})
    assert removed.status == 200 and removed.body["budget"] is None
