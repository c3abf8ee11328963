"""Follow-ups through the roles themselves (docs/followups.md): placed through the API under a
frozen clock, fired by `Scheduler.run_once()`, checked by `WorkerPool.run_once()`; time moves
by hand. Every check lands on the follow-up's resolution, the first and each recheck; a check
cancelled by key while it runs ends cancelled and writes no further check; a recheck in the
past, and one that cannot be read, end the chain with their reason; an agent run's final
output decides like a webhook's answer."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import anyio
import asyncpg

from promptsched.clock import FrozenClock
from promptsched.metrics import Metrics
from promptsched.roles.scheduler import Scheduler
from tests import api_support, factories
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.helpers import wait_until
from tests.test_agent import agent_workers
from tests.test_providers_integration import PROVIDER

T0 = datetime.fromisoformat("2026-03-02T09:00:20+00:00")
SLOT = datetime.fromisoformat("2026-03-02T09:15:00+00:00")  # T0 rounded up to 15 minutes
NEXT = datetime.fromisoformat("2026-03-02T09:30:00+00:00")


def _answer(decision: str) -> str:
    """A prompt whose echo carries ``decision`` as its last fenced JSON block (the echo
    provider's output is the prompt: the check answers what the prompt says)."""
    return f"Has order {{{{ order }}}} shipped?\n```json\n{decision}\n```"


async def _fire(pool: asyncpg.Pool[Any], at: datetime) -> int:
    """The scheduler's tick at ``at``: how many checks it wrote."""
    return (await Scheduler(pool, FrozenClock(at), Metrics()).run_once()).enqueued


async def _work(pool: asyncpg.Pool[Any], at: datetime) -> int:
    """One drain of a worker pool at ``at``: how many checks it ran."""
    return await factories.worker_pool(pool, FrozenClock(at), slots=16).run_once()


async def _followups(pool: asyncpg.Pool[Any]) -> dict[str, asyncpg.Record]:
    return {r["key"]: r for r in await pool.fetch("SELECT * FROM followups")}


async def _checks(pool: asyncpg.Pool[Any], key: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT c.* FROM followup_checks c JOIN followups f USING (schedule_id) "
        "WHERE f.key = $1 ORDER BY c.number", key,
    )  # fmt: skip


async def test_every_check_of_many_followups_lands_on_their_resolution(
    pool: asyncpg.Pool[Any],
) -> None:
    # Thirty follow-ups placed over the API between 09:00:50 and 09:12:55, resolution 15m:
    # all first checks at 09:15. Each recheck asks for another instant; it is rounded up too.
    answers = {
        0: ('{"recheck_in": "7m"}', {}),  # 09:22 -> 09:30
        1: ('{"recheck_in": "15m"}', {}),  # 09:30, on a slot: stays
        # 09:31 is within the horizon (09:35) but its rounded instant, 09:45, is not.
        2: ('{"recheck_at": "2026-03-02T09:31:00Z"}', {"horizon": "20m"}),
    }
    async with api_support.client(pool, clock=FrozenClock(T0)) as api:
        who = await api.token("shop")
        for i in range(30):
            decision, extra = answers[i % 3]
            body = {"key": f"order-{i}", "in": f"{30 + 25 * i}s", "resolution": "15m",
                    "prompt": _answer(decision), "vars": {"order": i}, "max_checks": 2,
                    **extra}  # fmt: skip
            reply = await api.post("/v1/followups", who, json=body)
            assert reply.status == 201, reply.body
            assert reply.body["due_at"] == SLOT.isoformat()
            assert reply.body["resolution"] == "15m"
    assert {r["due_at"] for r in (await _followups(pool)).values()} == {SLOT}
    assert await pool.fetchval("SELECT array_agg(DISTINCT next_fire_at) FROM schedules") == [SLOT]

    # Nothing is due a moment before the slot; at the slot, all thirty at once.
    assert await _fire(pool, SLOT - timedelta(milliseconds=1)) == 0
    assert await _fire(pool, SLOT) == 30
    assert await pool.fetchval("SELECT array_agg(DISTINCT slot) FROM runs") == [SLOT]
    assert await _work(pool, SLOT) == 30

    for i in range(30):
        [first] = await _checks(pool, f"order-{i}")
        if i % 3 == 2:
            expected = ("horizon", datetime.fromisoformat("2026-03-02T09:45:00+00:00"))
        else:
            expected = ("recheck", NEXT)
        assert (first["outcome"], first["next_at"]) == expected, i
    rows = await _followups(pool)
    horizon_ended = {k for k, r in rows.items() if r["ended_reason"] == "horizon"}
    assert horizon_ended == {f"order-{i}" for i in range(2, 30, 3)}
    # The twenty rechecks are pending runs at 09:30 exactly: one batch at a known instant.
    rechecks = await pool.fetch("SELECT slot, available_at FROM runs WHERE origin = 'check'")
    assert len(rechecks) == 20
    assert {(r["slot"], r["available_at"]) for r in rechecks} == {(NEXT, NEXT)}
    assert await _work(pool, NEXT - timedelta(milliseconds=1)) == 0
    assert await _work(pool, NEXT) == 20
    rows = await _followups(pool)
    assert sorted({(r["state"], r["ended_reason"], r["checks"]) for r in rows.values()}) == [
        ("ended", "horizon", 1),
        ("ended", "max_checks", 2),
    ]
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE status <> 'succeeded'") == 0


async def test_cancelling_a_running_check_by_key_ends_it_cancelled_and_writes_no_next(
    pool: asyncpg.Pool[Any],
) -> None:
    due = T0 + timedelta(minutes=1)
    body = {"key": "order-9", "in": "1m", "prompt": _answer('{"recheck_in": "1h"}'),
            "vars": {"order": 9}, "params": {"latency": "60s"}}  # fmt: skip
    async with api_support.client(pool, clock=FrozenClock(T0)) as api:
        who = await api.token("shop")
        assert (await api.post("/v1/followups", who, json=body)).status == 201
    assert await _fire(pool, due) == 1
    workers = factories.worker_pool(pool, FrozenClock(due))
    cancelled_at = due + timedelta(seconds=5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(workers.run_once)

        async def running() -> bool:
            return await pool.fetchval("SELECT status FROM runs") == "running"

        await wait_until(running, timeout=10, what="the check to start")
        async with api_support.client(pool, clock=FrozenClock(cancelled_at)) as api:
            assert (await api.delete("/v1/followups/order-9", who)).status == 204
            # While the check still runs: the follow-up is cancelled, the run asked to stop.
            shown = (await api.get("/v1/followups/order-9", who)).body
            assert shown["state"] == "cancelled"
            [rid] = [r["id"] for r in shown["runs"]]
            run = await api.get(f"/v1/runs/{rid}", who)
            assert (run.body["status"], run.body["cancel_requested"]) == ("running", True)
            assert await workers.heartbeat.run_once() == 1  # it learns of it and stops
    async with api_support.client(pool) as api:
        shown = (await api.get("/v1/followups/order-9", who)).body
        runs = (await api.get("/v1/followups/order-9/runs", who)).body["items"]
    [run] = runs
    assert (run["status"], run["origin"]) == ("cancelled", "cadence")
    assert await factories.attempt_statuses(pool, run["id"]) == ["cancelled"]
    # The ledger says who cancelled it and when; no further check was written, ever.
    assert (shown["state"], shown["cancelled_by"]) == ("cancelled", "shop")
    assert shown["cancelled_at"] == cancelled_at.isoformat()
    assert shown["explanation"] == (
        f"Cancelled by shop at {cancelled_at:%Y-%m-%d %H:%M:%S} UTC, after 0 checks; "
        "no further check starts."
    )
    assert shown["checks"] == []
    later = due + timedelta(hours=2)
    assert await _fire(pool, later) == 0 and await _work(pool, later) == 0
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1


async def test_a_recheck_in_the_past_or_unreadable_ends_the_chain_with_its_reason(
    pool: asyncpg.Pool[Any],
) -> None:
    due = T0 + timedelta(minutes=1)
    cases = {
        "past": ('{"recheck_at": "2026-03-02T08:00:00Z"}', {}),
        # Checked at 09:15: 09:14 rounded up would be 09:15, not in the past; the past guard
        # judges the instant as answered.
        "past-rounded": ('{"recheck_at": "2026-03-02T09:14:00Z"}', {"resolution": "15m"}),
        "invalid": ('{"recheck_in": "soon"}', {}),
        "no-offset": ('{"recheck_at": "2026-03-03T09:00:00"}', {}),
    }
    async with api_support.client(pool, clock=FrozenClock(T0)) as api:
        who = await api.token("shop")
        for key, (decision, extra) in cases.items():
            body = {"key": key, "at": due.isoformat(), "prompt": _answer(decision),
                    "vars": {"order": key}, **extra}  # fmt: skip
            assert (await api.post("/v1/followups", who, json=body)).status == 201
        assert await _fire(pool, SLOT) == 4  # 09:01 and 09:15, both due by 09:15
        assert await _work(pool, SLOT) == 4
        shown = {key: (await api.get(f"/v1/followups/{key}", who)).body for key in cases}
    for key in ("past", "past-rounded"):
        assert (shown[key]["state"], shown[key]["ended_reason"]) == ("ended", "past"), key
    [check] = shown["past"]["checks"]
    assert check["decision"] == {"recheck_at": "2026-03-02T08:00:00+00:00"}
    assert check["outcome"] == "past"
    assert shown["past"]["explanation"] == (
        "Ended after check 1: its next check (2026-03-02 08:00 UTC) was in the past."
    )
    for key, error in (("invalid", "recheck_in: not a duration"),
                       ("no-offset", "recheck_at: needs a UTC offset")):  # fmt: skip
        assert (shown[key]["state"], shown[key]["ended_reason"]) == ("ended", "invalid"), key
        [check] = shown[key]["checks"]
        assert check["outcome"] == "invalid" and check["next_at"] is None
        assert check["decision"]["error"].startswith(error)
        assert shown[key]["explanation"] == (
            "Ended after check 1: its answer asked for a recheck that could not be read."
        )
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE origin = 'check'") == 0


async def test_an_agent_runs_final_output_decides_the_next_check(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI, pages: site.Pages
) -> None:
    due = T0 + timedelta(minutes=1)
    fake.script(
        fake_server.tool_calls(("http_get", {"url": pages.url("/page")})),
        fake_server.ok('Not shipped yet.\n```json\n{"recheck_in": "2h", "why": "no label"}\n```'),
        fake_server.ok('{"shipped": true}'),  # the second check: no recheck, done
    )
    body = {"key": "order-7", "in": "1m", "provider": PROVIDER,
            "prompt": "Has order {{ order }} shipped? Look at the tracking page.",
            "vars": {"order": 7}, "params": {"tools": ["http_get"], "max_steps": 4}}  # fmt: skip
    async with api_support.client(pool, clock=FrozenClock(T0), providers=(PROVIDER,),
                                  provider_kinds={PROVIDER: "openai"}) as api:  # fmt: skip
        who = await api.token("shop")
        assert (await api.post("/v1/followups", who, json=body)).status == 201
        assert await _fire(pool, due) == 1
        async with agent_workers(pool, FrozenClock(due), fake.base_url) as workers:
            assert await workers.run_once() == 1
        after_first = (await api.get("/v1/followups/order-7", who)).body
        recheck = due + timedelta(hours=2)
        async with agent_workers(pool, FrozenClock(recheck), fake.base_url) as workers:
            assert await workers.run_once() == 1
        shown = (await api.get("/v1/followups/order-7", who)).body
    [first] = after_first["checks"]
    assert first["decision"] == {"recheck_in": 7200.0}
    assert (first["outcome"], first["next_at"]) == ("recheck", recheck.isoformat())
    assert after_first["explanation"] == (
        f"Active: check 2 of at most 10 is due at {recheck:%Y-%m-%d %H:%M:%S} UTC "
        f"(run #{after_first['runs'][-1]['id']})."
    )
    assert (shown["state"], shown["checks_done"]) == ("done", 2)
    assert [(c["outcome"], c["decision"]) for c in shown["checks"]] == [
        ("recheck", {"recheck_in": 7200.0}),
        ("done", None),
    ]
    assert [(r["origin"], r["status"]) for r in shown["runs"]] == [
        ("cadence", "succeeded"),
        ("check", "succeeded"),
    ]
    # The first check was an agent run: the model read the page with a tool, then decided.
    assert pages.paths == ["/page"]
    assert [r.json["messages"][0]["content"] for r in fake.requests] == [
        "Has order 7 shipped? Look at the tracking page."
    ] * 3


async def test_racing_creates_of_one_key_make_one_followup(pool: asyncpg.Pool[Any]) -> None:
    """Twenty requests for the same key at once (and the same key for another owner): one
    201 per owner, the rest 200 with that follow-up, and one schedule and one followups row
    per owner. The followups table's (owner, key) index is the one promise behind it
    (migration 0017 dropped the schedules copy)."""
    body = {"key": "order-9", "in": "1h", "prompt": "Has order {{ order }} shipped?",
            "vars": {"order": 9}}  # fmt: skip
    async with api_support.client(pool, clock=FrozenClock(T0)) as api:
        shop, other = await api.token("shop"), await api.token("other")
        replies: list[api_support.Reply] = []

        async def create(who: dict[str, str]) -> None:
            replies.append(await api.post("/v1/followups", who, json=body))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(create, shop if i % 4 else other)
    assert sorted(r.status for r in replies) == [200] * 18 + [201, 201], [
        (r.status, r.body) for r in replies
    ]
    by_owner = {(r.body["owner"], r.body["schedule_id"]) for r in replies}
    assert len(by_owner) == 2 and {owner for owner, _ in by_owner} == {"shop", "other"}
    counts = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM schedules) AS schedules, "
        "(SELECT count(*) FROM followups) AS followups"
    )
    assert (counts["schedules"], counts["followups"]) == (2, 2)
