"""Agent runs through the HTTP API: the tool catalog checked when a schedule is saved, the
attempts' transcripts in GET /v1/runs/{id}, and the run event stream (SSE) of one process fed
by its listener."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg
from aiohttp.test_utils import TestClient, TestServer

from promptsched.api import app as api_app
from promptsched.console import routes as console_routes
from promptsched.metrics import Metrics
from promptsched.store import listen
from promptsched.tools.base import Catalog
from promptsched.web.progress import ProgressHub
from tests import factories
from tests.api_support import Api
from tests.helpers import wait_until

CATALOG = Catalog(
    {"http_get": None, "rss": None, "kb.write": "tool 'kb.write' is not marked read-only"}
)
AGENT = {
    "name": "harbour agent",
    "cron": "0 9 * * *",
    "prompt": "Weather?",
    "provider": "llm",
    "params": {"tools": ["http_get"], "max_steps": 3},
}


@asynccontextmanager
async def agent_api(pool: asyncpg.Pool[Any], hub: ProgressHub | None = None) -> AsyncIterator[Api]:
    app = api_app.build(
        pool, Metrics(), lambda: True, providers=("echo", "llm"),
        provider_kinds={"echo": "echo", "llm": "openai"}, tools=lambda: CATALOG, progress=hub,
        mounts=(console_routes.mount,),
    )  # fmt: skip
    async with TestClient(TestServer(app)) as client:
        yield Api(client, pool)


async def test_the_api_rejects_unknown_and_refused_tools_at_save_time(
    pool: asyncpg.Pool[Any],
) -> None:
    async with agent_api(pool) as api:
        who = await api.token("alice")
        bad = {**AGENT, "params": {"tools": ["http_get", "search_web"]}}
        reply = await api.post("/v1/schedules", who, json=bad)
        assert reply.status == 422
        assert reply.body["error"]["field"] == "params.tools[1]"
        assert (
            "unknown tool 'search_web'; available: http_get, kb.write, rss"
            in (reply.body["error"]["message"])
        )
        refused = await api.post(
            "/v1/schedules", who, json={**AGENT, "params": {"tools": ["kb.write"]}}
        )
        assert (refused.status, refused.body["error"]["field"]) == (422, "params.tools[0]")
        created = await api.post("/v1/schedules", who, json=AGENT)
        assert created.status == 201
        sid = created.body["id"]
        patched = await api.patch(f"/v1/schedules/{sid}", who, json={"params": {"tools": ["nope"]}})
        assert (patched.status, patched.body["error"]["field"]) == (422, "params.tools[0]")


async def test_a_run_shows_each_attempts_transcript(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool, params={"tools": ["http_get"]})
    await pool.execute("UPDATE schedules SET owner = 'alice' WHERE id = $1", sid)
    rid = await factories.pending_run(pool, sid)
    steps = [
        {"kind": "start", "step": 0, "tokens": 0, "text": "starting", "at": "2026-03-02T09:00Z"},
        {"kind": "model", "step": 1, "tokens": 10, "text": "step 1/8: the model calls http_get"},
    ]
    # A first attempt lost with its steps, and a second one running with none yet.
    lost_attempt = await pool.fetchval(
        "INSERT INTO ended_attempts (attempt_id, run_id, number, worker_id, status, started_at) "
        "VALUES (gen_random_uuid(), $1, 1, 'w', 'lost', now()) RETURNING attempt_id",
        rid,
    )
    for step in steps:
        await pool.execute(
            "INSERT INTO attempt_steps (run_id, attempt_id, entry) VALUES ($1, $2, $3::jsonb)",
            rid,
            lost_attempt,
            step,
        )
    await pool.execute(
        "UPDATE runs SET status = 'running', attempts = 2, attempt_id = gen_random_uuid(), "
        "worker_id = 'w', lease_expires_at = now() + interval '1 minute', "
        "attempt_started_at = now() WHERE id = $1",
        rid,
    )
    async with agent_api(pool) as api:
        reply = await api.get(f"/v1/runs/{rid}", await api.token("alice"))
    assert reply.status == 200
    lost, running = reply.body["attempt_history"]
    assert (lost["status"], lost["transcript"]) == ("lost", steps)
    assert (running["status"], running["transcript"]) == ("running", [])


async def _stream(
    api: Api, path: str, who: dict[str, str], into: list[tuple[str, Any]] | None = None
) -> list[tuple[str, Any]]:
    """Every ``(event, data)`` of a stream as it arrives, and its comments as
    ``("comment", text)``."""
    found: list[tuple[str, Any]] = [] if into is None else into
    async with api.client.get(path, headers=who) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["Cache-Control"] == "no-cache"
        fields: dict[str, str] = {}
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
            elif "event" in fields:
                found.append((fields["event"], json.loads(fields["data"])))
                fields = {}
            elif "" in fields:
                found.append(("comment", fields[""]))
                fields = {}
    return found


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


async def test_the_event_stream_of_a_run_relays_progress_and_ends_when_the_run_is_final(
    pool: asyncpg.Pool[Any], dsn: str
) -> None:
    sid = await factories.schedule(pool)
    await pool.execute("UPDATE schedules SET owner = 'alice' WHERE id = $1", sid)
    rid = await factories.pending_run(pool, sid)
    other = await factories.pending_run(pool, sid, factories.EPOCH.replace(hour=10))
    hub = ProgressHub(keepalive=0.2, poll=0.05)
    events: list[tuple[str, Any]] = []
    async with agent_api(pool, hub) as api, anyio.create_task_group() as tg:
        await tg.start(listen.Listener(dsn, {listen.CHANNEL_PROGRESS: hub.on_notify}).run)
        alice = await api.token("alice")
        assert (await api.get(f"/v1/runs/{rid}/events", await api.token("bob"))).status == 404
        assert (await api.get("/v1/runs/999/events", alice)).status == 404

        async def watch() -> None:
            await _stream(api, f"/v1/runs/{rid}/events", alice, into=events)

        tg.start_soon(watch)
        await wait_until(holds(lambda: hub.watching() == 1), timeout=10, what="subscribed")
        for run_id, text in ((other, "not ours"), (rid, "calling http_get"), (rid, "answered")):
            payload = {"run_id": run_id, "attempt": 1, "step": 1, "kind": "model", "text": text}
            await pool.execute("SELECT pg_notify($1, $2)", listen.CHANNEL_PROGRESS,
                               json.dumps(payload))  # fmt: skip
        progress = holds(lambda: len([e for e in events if e[0] == "progress"]) == 2)
        await wait_until(progress, timeout=10, what="two progress events")
        hub.on_notify(None)  # the listener reconnected: the stream says events may be lost
        # Idle now: the stream keeps itself alive with comments.
        keepalive = holds(lambda: ("comment", "keep-alive") in events)
        await wait_until(keepalive, timeout=10, what="a keep-alive comment")
        await pool.execute(
            "UPDATE runs SET status = 'succeeded', finished_at = now() WHERE id = $1", rid
        )
        await wait_until(holds(lambda: hub.watching() == 0), timeout=10, what="the stream's end")
        tg.cancel_scope.cancel()
    progress = [data["text"] for kind, data in events if kind == "progress"]
    assert progress == ["calling http_get", "answered"]
    assert ("gap", {"run_id": rid}) in events
    assert events[-1] == ("done", {"run_id": rid, "status": "succeeded"})


async def test_a_stream_of_a_finished_run_ends_at_once(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool)
    rid = await factories.pending_run(pool, sid)
    await pool.execute("UPDATE runs SET status = 'dead', finished_at = now() WHERE id = $1", rid)
    async with agent_api(pool) as api:
        events = await _stream(api, f"/v1/runs/{rid}/events", await api.token("default"))
    assert events == [("comment", f"watching run {rid}"), ("done", {"run_id": rid,
                                                                    "status": "dead"})]  # fmt: skip


async def test_a_stream_ends_after_its_time_limit(pool: asyncpg.Pool[Any]) -> None:
    sid = await factories.schedule(pool)
    rid = await factories.pending_run(pool, sid)
    async with agent_api(pool, ProgressHub(max_stream=0.2, poll=0.05)) as api:
        events = await _stream(api, f"/v1/runs/{rid}/events", await api.token("default"))
    assert events[-1] == ("comment", "stream time limit reached; reconnect to go on")
