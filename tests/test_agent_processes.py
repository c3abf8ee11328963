"""Issue 8 with real ``promptsched run`` processes: an agent attempt killed mid-loop (SIGKILL)
is retried from a fresh conversation while the lost attempt's transcript is kept, and one
notification goes out; an SSE client of one process streams the progress of a run another
process executes."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest

from promptsched import netguard
from promptsched.clock import Clock
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from promptsched.web import auth
from tests.factories import attempt_rows
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.fakes.http_sink import HttpSink
from tests.helpers import Service, wait_until
from tests.test_providers_integration import PROVIDER, provider_env

LOOPBACK = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)

pytestmark = pytest.mark.slow
PROMPT = "What is the weather at the harbour?"


def _env(fake: fake_server.FakeOpenAI, **extra: str) -> dict[str, str]:
    return {
        **provider_env(fake.base_url, timeout="30s"),
        "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32",  # the loopback sink
        "PROMPTSCHED_TOOLS_ALLOW": "127.0.0.1/32",  # the loopback pages
        **extra,
    }


async def _agent_schedule(
    pool: asyncpg.Pool[Any], owner: str = "default", notify: dict[str, Any] | None = None
) -> int:
    values = inputs.validate(
        {
            "name": "harbour agent", "cron": "0 0 1 1 *", "prompt": PROMPT,
            "provider": PROVIDER, "params": {"tools": ["http_get"], "max_steps": 4},
            "timeout": "30s", "max_attempts": 3, "notify": notify or {},
        },
        providers=[PROVIDER], provider_kinds={PROVIDER: "openai"}, webhook_allow=LOOPBACK,
    )  # fmt: skip
    async with pool.acquire() as conn, conn.transaction():
        row = await schedule_ops.create_schedule(conn, Clock(), values, owner=owner)
    sid: int = row.id
    return sid


async def test_an_attempt_killed_mid_loop_is_retried_from_a_fresh_conversation(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
    sink: HttpSink,
) -> None:
    look = fake_server.tool_calls(("http_get", {"url": pages.url("/page")}))
    fake.script(look, fake_server.hang(), look, fake_server.ok("Sunny; high tide at 09:12."))
    sid = await _agent_schedule(pool, notify={"webhook": {"url": sink.url}})
    first = Service(dsn, tmp_path / "first.log", env=_env(fake))
    second: Service | None = None
    try:
        await first.ready()
        async with pool.acquire() as conn:
            run = await schedule_ops.trigger_schedule(conn, Clock(), sid, owner=None, actor="test")
        rid = run["id"]

        async def mid_loop() -> bool:
            # The page was read and the second model call is in flight (it never answers).
            steps = await pool.fetchval(
                "SELECT jsonb_array_length(transcript) FROM run_attempts WHERE run_id = $1", rid
            )
            return len(fake.requests) == 2 and steps == 4

        await wait_until(mid_loop, timeout=20, what="the first attempt mid-loop")
        first.signal(signal.SIGKILL)
        second = Service(dsn, tmp_path / "second.log", env=_env(fake))
        await second.ready()

        async def delivered() -> bool:
            status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid)
            return status == "succeeded" and len(sink.requests) >= 1

        await wait_until(delivered, timeout=30, what="the retried run and its notification")
        await wait_until(
            lambda: _outbox_sent(pool, rid), timeout=10, what="the outbox row marked sent"
        )
    finally:
        first.stop()
        if second is not None:
            second.stop()

    output = await pool.fetchval("SELECT output FROM runs WHERE id = $1", rid)
    assert output == "Sunny; high tide at 09:12."
    lost, won = await attempt_rows(pool, rid)
    assert (lost["status"], won["status"]) == ("lost", "succeeded")
    assert lost["worker_id"].endswith(f":{first.pid}")
    # The lost attempt's transcript is kept as far as it got.
    assert [s["kind"] for s in lost["transcript"]] == ["start", "model", "tool_call", "tool_result"]
    assert [s["kind"] for s in won["transcript"]] == [
        "start", "model", "tool_call", "tool_result", "model",
    ]  # fmt: skip
    # Every attempt is a fresh conversation: the retry's first request repeats nothing.
    requests = [request.json["messages"] for request in fake.requests]
    assert len(requests) == 4
    assert requests[0] == requests[2] == [{"role": "user", "content": PROMPT}]
    assert [m["role"] for m in requests[3]] == ["user", "assistant", "tool"]
    assert pages.paths == ["/page", "/page"]
    # Exactly one notification for the run.
    (delivery,) = sink.requests
    assert delivery.json()["run"]["id"] == rid and delivery.json()["output"] == output
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE run_id = $1", rid) == 1


async def _outbox_sent(pool: asyncpg.Pool[Any], run_id: int) -> bool:
    statuses = await pool.fetch("SELECT status FROM outbox WHERE run_id = $1", run_id)
    return [row["status"] for row in statuses] == ["sent"]


async def _read_events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str]]:
    """``(field, value)`` lines of an event stream; ``("", "")`` at each event's end."""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            yield "", ""
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            yield field, value.lstrip(" ")


async def _owed_agent_run(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI, pages: site.Pages
) -> tuple[int, str]:
    """alice's agent run (one page read, then an answer), owed in an hour so that clients
    subscribe before it may start; its id and a token of alice's."""
    fake.script(
        fake_server.tool_calls(("http_get", {"url": pages.url("/page")})),
        fake_server.ok("Sunny."),
    )
    sid = await _agent_schedule(pool, owner="alice")
    token, _ = await auth.create_token(pool, owner="alice")
    rid: int = await pool.fetchval(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at) "
        "SELECT id, now(), 'manual', provider, max_attempts, now() + interval '1 hour' "
        "FROM schedules WHERE id = $1 RETURNING id",
        sid,
    )
    return rid, token


async def test_an_sse_client_streams_the_progress_of_a_run_on_another_process(
    dsn: str,
    pool: asyncpg.Pool[Any],
    tmp_path: Path,
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
) -> None:
    rid, token = await _owed_agent_run(pool, fake, pages)
    stranger, _ = await auth.create_token(pool, owner="mallory")
    worker = Service(dsn, tmp_path / "worker.log", env=_env(
        fake, PROMPTSCHED_ROLES="scheduler,worker,reaper,notifier"))  # fmt: skip
    api = Service(dsn, tmp_path / "api.log", env=_env(fake, PROMPTSCHED_ROLES="api"))
    events: list[tuple[str, dict[str, Any]]] = []
    try:
        await worker.ready()
        port = (await api.wait_event("api.listening"))["port"]
        url = f"http://127.0.0.1:{port}/v1/runs/{rid}/events"
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers={"Authorization": f"Bearer {stranger}"}) as other:
                assert other.status == 404
            async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as response:
                assert response.status == 200
                assert response.headers["Content-Type"] == "text/event-stream"
                first = await response.content.readline()
                assert first == b"retry: 2000\n"  # subscribed: now the run may start
                await pool.execute("UPDATE runs SET available_at = now() WHERE id = $1; ", rid)
                await pool.execute("SELECT pg_notify('promptsched_runs', 'test')")
                with anyio.fail_after(30):
                    kind, data = "", ""
                    async for field, value in _read_events(response):
                        if field == "event":
                            kind = value
                        elif field == "data":
                            data = value
                        elif field == "" and kind:
                            events.append((kind, json.loads(data)))
                            kind = ""
    finally:
        worker.stop()
        api.stop()

    progress = [data for kind, data in events if kind == "progress"]
    assert [(e["run_id"], e["attempt"], e["kind"]) for e in progress] == [
        (rid, 1, kind) for kind in ("start", "model", "tool_call", "tool_result", "model")
    ]
    assert progress[1]["text"] == "step 1/4: the model calls http_get"
    assert progress[2]["text"].startswith("calling http_get")
    assert progress[-1]["tokens"] == 20
    assert events[-1] == ("done", {"run_id": rid, "status": "succeeded"})
