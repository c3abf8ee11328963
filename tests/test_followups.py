"""Follow-ups (issue 22) end to end: a real `promptsched run` process, its HTTP API, and a fake
webhook provider on loopback that answers each check. A chain that asks to be checked again
twice and then is done runs three checks, escalates once after the second, and its history
shows every decision; max_checks and the horizon each end a chain with their reason; vars reach
the prompt; bad vars are refused naming the field, and nothing is stored."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest
from aiohttp import web

from promptsched.clock import FrozenClock
from promptsched.metrics import Metrics
from promptsched.ops import followups as followup_ops
from promptsched.roles.retention import Retention
from promptsched.web import auth
from tests import api_support
from tests.api_support import Api
from tests.fakes import serve
from tests.fakes.http_sink import HttpSink, start_http_sink
from tests.helpers import Service, wait_until


class Provider:
    """The fake webhook provider: each check's prompt names its chain; the chain's script of
    answers (JSON bodies) is played in order, then ``{"done": true}``."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[dict[str, Any]]] = {}
        self.prompts: dict[str, list[str]] = defaultdict(list)
        self.followups: dict[str, list[Any]] = defaultdict(list)  # the request's key and vars

    async def handle(self, request: web.Request) -> web.Response:
        payload = await request.json()
        prompt: str = payload["prompt"]
        chain = prompt.split()[-1].rstrip("?")
        self.prompts[chain].append(prompt)
        self.followups[chain].append(payload.get("followup"))
        script = self.scripts.get(chain, [])
        answer = script.pop(0) if script else {"done": True}
        return web.json_response(answer)


@pytest.fixture
async def provider() -> AsyncIterator[tuple[Provider, str]]:
    fake = Provider()
    app = web.Application()
    app.router.add_post("/check", fake.handle)
    async with serve(app) as base_url:
        yield fake, f"{base_url}/check"


@pytest.fixture
async def escalations() -> AsyncIterator[HttpSink]:
    async with start_http_sink() as sink:
        yield sink


async def _service(dsn: str, tmp_path: Path, hook: str) -> tuple[Service, str]:
    env = {
        "PROMPTSCHED_PROVIDERS": "hook",
        "PROMPTSCHED_PROVIDER_HOOK_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_HOOK_BASE_URL": hook,
        "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32",
    }
    service = Service(dsn, tmp_path / "service.log", env=env)
    port = (await service.wait_event("api.listening", timeout=60))["port"]
    return service, f"http://127.0.0.1:{port}"


async def _state(pool: asyncpg.Pool[Any], key: str) -> str | None:
    state: str | None = await pool.fetchval("SELECT state FROM followups WHERE key = $1", key)
    return state


async def test_a_chain_rechecks_escalates_and_ends_with_its_reason(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    provider: tuple[Provider, str],
    escalations: HttpSink,
) -> None:
    fake, hook = provider
    again = {"recheck_in": "2s"}
    fake.scripts = {"4711": [again, again], "cap": [again] * 10, "far": [{"recheck_in": "1h"}]}
    token, _ = await auth.create_token(pool, owner="shop")
    who = {"Authorization": f"Bearer {token}"}
    service, url = await _service(dsn, tmp_path, hook)
    try:
        async with aiohttp.ClientSession(headers=who) as http:
            body = {
                "key": "order-4711-unshipped", "in": "1s", "provider": "hook",
                "prompt": "Has order {{ order_id }} shipped? Check {{ order_id }}",
                "vars": {"order_id": "4711"}, "max_checks": 5,
                "escalate": [{"after_checks": 2,
                              "notify": {"webhook": {"url": escalations.url}}}],
            }  # fmt: skip
            async with http.post(f"{url}/v1/followups", json=body) as reply:
                assert reply.status == 201, await reply.text()
                created = await reply.json()
            # The same key and body again: the same follow-up, 200; another body: 409.
            async with http.post(f"{url}/v1/followups", json=body) as reply:
                assert reply.status == 200
                again = await reply.json()
            assert (again["key"], again["schedule_id"], again["due_at"]) == (
                "order-4711-unshipped",
                created["schedule_id"],
                created["due_at"],
            )
            async with http.post(f"{url}/v1/followups", json={**body, "in": "2h"}) as reply:
                assert reply.status == 409
                assert "in differs" in (await reply.json())["error"]["message"]
            for key, chain, extra in (("cap-chain", "cap", {"max_checks": 2}),
                                      ("far-chain", "far", {"horizon": "30m"})):  # fmt: skip
                guarded = {"key": key, "in": "1s", "provider": "hook",
                           "prompt": f"Check {chain}", **extra}  # fmt: skip
                async with http.post(f"{url}/v1/followups", json=guarded) as reply:
                    assert reply.status == 201, await reply.text()

            async def finished() -> bool:
                states = [await _state(pool, k) for k in
                          ("order-4711-unshipped", "cap-chain", "far-chain")]  # fmt: skip
                return all(s not in (None, "active") for s in states)

            await wait_until(finished, timeout=60, what="the three chains to end")
            async with http.get(f"{url}/v1/followups/order-4711-unshipped") as reply:
                assert reply.status == 200
                shown = await reply.json()
            with anyio.fail_after(20):
                await escalations.wait_for(lambda sink: len(sink.requests) >= 1)
    finally:
        service.stop()
    # Three checks: recheck, recheck, done; each a run of its own, the rechecks of origin check.
    assert shown["state"] == "done" and shown["checks_done"] == 3
    assert shown["explanation"].startswith("Done: check 3 answered without asking")
    assert [c["outcome"] for c in shown["checks"]] == ["recheck", "recheck", "done"]
    assert [c["decision"] for c in shown["checks"]] == [
        {"recheck_in": 2.0},
        {"recheck_in": 2.0},
        None,
    ]
    assert [(r["origin"], r["status"]) for r in shown["runs"]] == [
        ("cadence", "succeeded"),
        ("check", "succeeded"),
        ("check", "succeeded"),
    ]
    assert shown["checks"][1]["escalated"] == [0] and shown["checks"][0]["escalated"] == []
    # vars reached the prompt, every time, and the request names the follow-up with its vars.
    assert fake.prompts["4711"] == ["Has order 4711 shipped? Check 4711"] * 3
    identity = {"key": "order-4711-unshipped", "vars": {"order_id": "4711"}}
    assert fake.followups["4711"] == [identity] * 3
    # One escalation, after the second check, to the step's own target.
    [sent] = escalations.requests
    payload = sent.json()
    assert payload["event"] == "followup.escalation"
    assert payload["escalation"]["after_checks"] == 2
    assert payload["escalation"]["key"] == "order-4711-unshipped"
    # The guards: max_checks ends "cap" after 2 checks, the horizon ends "far" after 1.
    rows = {r["key"]: r for r in await pool.fetch("SELECT * FROM followups")}
    cap, far = rows["cap-chain"], rows["far-chain"]
    assert (cap["state"], cap["ended_reason"]) == ("ended", "max_checks")
    assert cap["checks"] == 2 and len(fake.prompts["cap"]) == 2
    assert (far["state"], far["ended_reason"]) == ("ended", "horizon")
    async with api_support.client(pool) as api:
        explained = (await api.get("/v1/followups/cap-chain", who)).body["explanation"]
    assert explained == (
        "Ended after check 2: it reached its max_checks (2) still asking to be checked again."
    )
    assert far["checks"] == 1 and len(fake.prompts["far"]) == 1
    pending = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'pending'")
    assert pending == 0  # no chain left a check behind
    assert await pool.fetchval("SELECT count(*) FROM schedules") == 3  # the 200 made none


async def test_vars_are_checked_and_a_bad_request_stores_nothing(
    pool: asyncpg.Pool[Any], api: Api
) -> None:
    who = await api.token("shop")
    before = await api_support.snapshot(pool)
    base = {"key": "k-1", "in": "1h", "prompt": "Has {{ order_id }} shipped?"}
    for body, field in (
        ({**base}, "vars.order_id"),  # missing
        ({**base, "vars": {"order_id": {"nested": 1}}}, "vars.order_id"),  # wrong type
        ({**base, "vars": {"order_id": "1", "date": "x"}}, "vars.date"),  # a built-in name
        ({**base, "vars": {"order_id": "x" * 9000}}, "vars"),  # too large
        ({**base, "vars": ["order_id"]}, "vars"),
        ({**base, "vars": {"order_id": "1"}, "in": "soon"}, "in"),
        ({**base, "vars": {"order_id": "1"}, "in": None, "at": "2020-01-01T00:00:00Z"}, "at"),
        ({**base, "vars": {"order_id": "1"}, "key": "has space"}, "key"),
        (
            {
                **base,
                "vars": {"order_id": "1"},
                "max_checks": 3,
                "escalate": [{"after_checks": 3, "notify": {"email": ["a@example.com"]}}],
            },
            "escalate[0].after_checks",
        ),
    ):
        reply = await api.post("/v1/followups", who, json=body)
        assert reply.status == 422, (body, reply.body)
        assert reply.body["error"]["field"] == field, (body, reply.body)
    assert await api_support.snapshot(pool) == before
    assert await pool.fetchval("SELECT count(*) FROM followups") == 0
    good = await api.post("/v1/followups", who, json={**base, "vars": {"order_id": 4711}})
    assert good.status == 201, good.body
    assert good.body["vars"] == {"order_id": 4711}
    # Cancel by key: idempotent; an unknown key is 404; another owner's key is not found.
    assert (await api.delete("/v1/followups/k-1", who)).status == 204
    assert (await api.delete("/v1/followups/k-1", who)).status == 204
    assert (await api.delete("/v1/followups/nope", who)).status == 404
    assert (await api.get("/v1/followups/k-1", await api.token("other"))).status == 404
    shown = await api.get("/v1/followups/k-1", who)
    assert shown.body["state"] == "cancelled" and shown.body["cancelled_by"] == "shop"
    assert shown.body["explanation"].startswith("Cancelled by shop at ")
    listed = await api.get("/v1/followups?state=cancelled", who)
    assert [f["key"] for f in listed.body["items"]] == ["k-1"]
    json.dumps(listed.body)


class _TickingClock(FrozenClock):
    """Every read of the clock is 2 ms after the one before, as a request's reads are."""

    def sql_now(self) -> datetime | None:
        self.advance(timedelta(milliseconds=2))
        return self.instant


async def test_in_one_second_is_never_already_past_when_the_schedule_is_made(
    pool: asyncpg.Pool[Any],
) -> None:
    # Read at 12:00:00.9995, "in 1s" is 12:00:01.9995. The first check is an `at` schedule,
    # which keeps whole seconds: truncated, 12:00:01 would be past by the time the schedule is
    # created (the clock's next read, 2 ms later).
    clock = _TickingClock(datetime(2026, 11, 27, 12, 0, 0, 997_500, tzinfo=UTC))
    raw = {"key": "edge", "in": "1s", "prompt": "still there?"}
    async with pool.acquire() as conn:
        created, shown = await followup_ops.create(
            conn, clock, raw, owner="shop", actor="shop", providers=["echo"]
        )
    assert created, shown
    due = datetime(2026, 11, 27, 12, 0, 2, tzinfo=UTC)
    assert shown["due_at"] == due.isoformat()
    assert await pool.fetchval("SELECT next_fire_at FROM schedules") == due


async def test_an_ended_followup_keeps_its_ledger_for_the_retention(
    pool: asyncpg.Pool[Any], api: Api
) -> None:
    who = await api.token("shop")
    for key in ("kept", "old"):
        reply = await api.post("/v1/followups", who, json={"key": key, "in": "1h", "prompt": "p"})
        assert reply.status == 201, reply.body
    assert (await api.delete("/v1/followups/old", who)).status == 204
    retention = timedelta(days=30)
    now = await pool.fetchval("SELECT now()")
    # Within the retention the cancelled one stays, with who cancelled it.
    early = Retention(pool, FrozenClock(now + retention - timedelta(hours=1)), Metrics(),
                      retention=retention)  # fmt: skip
    assert await early.run_once() == 0
    assert (await api.get("/v1/followups/old", who)).body["cancelled_by"] == "shop"
    late = Retention(pool, FrozenClock(now + retention + timedelta(hours=1)), Metrics(),
                     retention=retention)  # fmt: skip
    assert await late.run_once() == 1
    assert (await api.get("/v1/followups/old", who)).status == 404
    # An active one is never purged, however old.
    assert (await api.get("/v1/followups/kept", who)).body["state"] == "active"
