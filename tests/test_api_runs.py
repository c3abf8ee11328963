"""The runs and notifications API against real Postgres and a real worker pool: list, get
with attempts, cancel (pending at once, running cooperatively), replay, dead letters."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import asyncpg

from promptsched.clock import Clock
from tests import api_support, factories
from tests.api_support import SCHEDULE, Api
from tests.helpers import wait_until

_NAMES = itertools.count(1)


async def _schedule(api: Api, who: dict[str, str], **fields: Any) -> int:
    """A schedule named after its id to come (names are unique per owner)."""
    named = {"name": f"runs {next(_NAMES)}"}
    reply = await api.post("/v1/schedules", who, json={**SCHEDULE, **named, **fields})
    assert reply.status == 201, reply.body
    return int(reply.body["id"])


async def _trigger(api: Api, who: dict[str, str], sid: int) -> int:
    reply = await api.post(f"/v1/schedules/{sid}/trigger", who)
    assert reply.status == 201, reply.body
    return int(reply.body["id"])


async def test_list_and_get_runs_with_attempts_output_and_errors(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    good = await _schedule(api, alice)
    bad = await _schedule(api, alice, max_attempts=2, params={"fail_attempts": 9})
    ok_run = await _trigger(api, alice, good)
    dead_run = await _trigger(api, alice, bad)
    extra = [await _trigger(api, alice, good) for _ in range(2)]
    await factories.worker_pool(pool, Clock()).run_once()
    await pool.execute("UPDATE runs SET available_at = now() WHERE status = 'pending'")
    await factories.worker_pool(pool, Clock()).run_once()  # the retry of the failing run

    detail = await api.get(f"/v1/runs/{ok_run}", alice)
    assert detail.status == 200
    assert (detail.body["status"], detail.body["attempts"]) == ("succeeded", 1)
    assert detail.body["output"] and detail.body["error"] is None
    assert [a["status"] for a in detail.body["attempt_history"]] == ["succeeded"]
    failed = await api.get(f"/v1/runs/{dead_run}", alice)
    assert failed.body["status"] == "dead"
    assert [a["status"] for a in failed.body["attempt_history"]] == ["failed", "failed"]
    assert failed.body["error"] and failed.body["attempt_history"][0]["error"]

    everything = await api.get("/v1/runs", alice)
    assert [r["id"] for r in everything.body["items"]] == sorted(
        [ok_run, dead_run, *extra], reverse=True
    )
    dead = await api.get("/v1/runs?status=dead", alice)
    assert [r["id"] for r in dead.body["items"]] == [dead_run]
    page = await api.get(f"/v1/runs?schedule_id={good}&limit=2", alice)
    assert [r["id"] for r in page.body["items"]] == [extra[1], extra[0]]
    rest = await api.get(f"/v1/runs?schedule_id={good}&cursor={page.body['next_cursor']}", alice)
    assert [r["id"] for r in rest.body["items"]] == [ok_run]
    assert rest.body["next_cursor"] is None
    per_schedule = await api.get(f"/v1/schedules/{bad}/runs", alice)
    assert [r["id"] for r in per_schedule.body["items"]] == [dead_run]
    none = await api.get(f"/v1/schedules/{bad}/runs?status=succeeded", alice)
    assert none.body["items"] == []
    assert (await api.get("/v1/runs/999999", alice)).status == 404
    assert (await api.get("/v1/schedules/999999/runs", alice)).status == 404


async def test_cancel_a_pending_run_at_once(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    rid = await _trigger(api, alice, await _schedule(api, alice))
    reply = await api.post(f"/v1/runs/{rid}/cancel", alice)
    assert reply.status == 200
    assert (reply.body["status"], reply.body["error"]) == ("cancelled", "cancelled by alice")
    assert reply.body["finished_at"] is not None
    again = await api.post(f"/v1/runs/{rid}/cancel", alice)  # idempotent
    assert again.status == 200 and again.body["status"] == "cancelled"
    assert await factories.worker_pool(pool, Clock()).run_once() == 0  # never claimed


async def test_cancel_a_running_run_stops_it_at_the_next_heartbeat(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    rid = await _trigger(api, alice, await _schedule(api, alice, params={"latency": "60s"}))
    workers = factories.worker_pool(pool, Clock())
    async with anyio.create_task_group() as tg:
        tg.start_soon(workers.run_once)

        async def running() -> bool:
            return await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid) == "running"

        await wait_until(running, timeout=10, what="the run to start")
        reply = await api.post(f"/v1/runs/{rid}/cancel", alice)
        assert reply.status == 202
        assert (reply.body["status"], reply.body["cancel_requested"]) == ("running", True)
        assert await workers.heartbeat.run_once() == 1  # the heartbeat learns it and stops it
    final = await api.get(f"/v1/runs/{rid}", alice)
    assert (final.body["status"], final.body["cancel_requested"]) == ("cancelled", False)
    assert [a["status"] for a in final.body["attempt_history"]] == ["cancelled"]
    finished = await api.post(f"/v1/runs/{rid}/cancel", alice)
    assert finished.status == 200  # cancelling a cancelled run is a no-op


async def test_cancel_a_finished_run_conflicts(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    rid = await _trigger(api, alice, await _schedule(api, alice))
    await factories.worker_pool(pool, Clock()).run_once()
    before = await api_support.snapshot(pool)
    reply = await api.post(f"/v1/runs/{rid}/cancel", alice)
    assert reply.status == 409 and "succeeded" in reply.body["error"]["message"]
    assert await api_support.snapshot(pool) == before


async def test_replay_a_dead_run_once(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(api, alice, max_attempts=1, params={"fail_attempts": 1})
    dead = await _trigger(api, alice, sid)
    await factories.worker_pool(pool, Clock()).run_once()
    assert (await api.get(f"/v1/runs/{dead}", alice)).body["status"] == "dead"

    fixed = await api.patch(f"/v1/schedules/{sid}", alice, json={"params": {}})  # the fix
    assert fixed.status == 200
    reply = await api.post(f"/v1/runs/{dead}/replay", alice)
    assert reply.status == 201
    replay = reply.body
    assert (replay["origin"], replay["replay_of"], replay["status"]) == ("replay", dead, "pending")
    original = await api.get(f"/v1/runs/{dead}", alice)
    assert replay["slot"] == original.body["slot"]
    assert original.body["replayed_by"] == replay["id"]

    twice = await api.post(f"/v1/runs/{dead}/replay", alice)
    assert twice.status == 409 and f"run {replay['id']}" in twice.body["error"]["message"]
    not_dead = await api.post(f"/v1/runs/{replay['id']}/replay", alice)
    assert not_dead.status == 409 and "only a dead run" in not_dead.body["error"]["message"]

    await factories.worker_pool(pool, Clock()).run_once()
    done = await api.get(f"/v1/runs/{replay['id']}", alice)
    assert done.body["status"] == "succeeded"


async def _dead_notification(pool: asyncpg.Pool[Any], run_id: int) -> int:
    nid: int = await pool.fetchval(
        "INSERT INTO outbox (run_id, schedule_id, channel, target, event, status, attempts, "
        "max_attempts, last_error, idempotency_key) "
        "SELECT id, schedule_id, 'webhook', '{\"url\": \"https://example.com/h\"}'::jsonb, "
        "'succeeded', 'dead', 10, 10, 'HTTP 500', 'k-' || id FROM runs WHERE id = $1 "
        "RETURNING id",
        run_id,
    )
    return nid


async def test_dead_notifications_list_and_replay(
    api: Api, alice: dict[str, str], pool: asyncpg.Pool[Any]
) -> None:
    rid = await _trigger(api, alice, await _schedule(api, alice))
    nid = await _dead_notification(pool, rid)
    listed = await api.get("/v1/notifications/dead", alice)
    assert [(n["id"], n["status"], n["last_error"]) for n in listed.body["items"]] == [
        (nid, "dead", "HTTP 500")
    ]
    assert (await api.get(f"/v1/runs/{rid}", alice)).body["notifications"][0]["id"] == nid
    replayed = await api.post(f"/v1/notifications/{nid}/replay", alice)
    assert replayed.status == 200
    assert (replayed.body["status"], replayed.body["attempts"]) == ("pending", 0)
    assert (await api.get("/v1/notifications/dead", alice)).body["items"] == []
    again = await api.post(f"/v1/notifications/{nid}/replay", alice)
    assert again.status == 409
    assert (await api.post("/v1/notifications/999999/replay", alice)).status == 404
