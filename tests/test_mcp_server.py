"""promptsched as an MCP server, through the official MCP Python SDK client over both
transports against one real ``promptsched run``: ``promptsched mcp`` over stdio (going through
the service's API with a token) and ``/mcp`` over Streamable HTTP on the service's own port.
Tools listed with descriptions and schemas, a schedule that fires and its output read as a
resource, a follow-up placed twice under one key, argument errors as tool errors naming the
argument, another owner's token seeing nothing, and a revoked token refused at once."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres
from promptsched.web import auth
from tests.conftest import TEMPLATE
from tests.helpers import Service, admin_execute, wait_until

TRANSPORTS = ("stdio", "http")
TOOLS = {
    "preview_schedule", "create_schedule", "list_schedules", "show_schedule", "edit_schedule",
    "pause_schedule", "resume_schedule", "trigger_schedule", "delete_schedule",
    "place_followup", "show_followup", "list_followups", "cancel_followup",
    "list_runs", "show_run", "diff_runs", "fleet_status",
}  # fmt: skip
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Running:
    dsn: str
    url: str


@pytest.fixture(scope="module")
def service(
    pg_server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """One service for the module (every test uses owners of its own): all roles, the echo
    provider."""
    import asyncio

    name = f"t_{uuid.uuid4().hex[:16]}"
    asyncio.run(admin_execute(pg_server, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}"))
    dsn = pg_server.dsn(name)
    process = Service(dsn, tmp_path_factory.mktemp("mcp") / "service.log")
    try:
        port = asyncio.run(process.wait_event("api.listening", timeout=60))["port"]
        yield Running(dsn, f"http://127.0.0.1:{port}")
    finally:
        process.stop()
        asyncio.run(admin_execute(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def _sql(dsn: str, query: str, *args: Any) -> Any:
    conn = await pools.connect(dsn)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def _token(dsn: str, owner: str, *, admin: bool = False) -> tuple[str, int]:
    conn = await pools.connect(dsn)
    try:
        token, row = await auth.create_token(conn, owner=owner, admin=admin)
    finally:
        await conn.close()
    return token, row["id"]


def _owner(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def connect(
    service: Running, token: str, transport: str, mode: str = "auto"
) -> AsyncIterator[Client]:
    """The official SDK client: ``promptsched mcp`` as a child over stdio, or ``/mcp``;
    ``auto`` negotiates the newest protocol, ``legacy`` the ``initialize`` handshake."""
    if transport == "http":
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with (
            http,
            Client(streamable_http_client(f"{service.url}/mcp", http_client=http)) as client,
        ):
            yield client
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    env.update({"PROMPTSCHED_URL": service.url, "PROMPTSCHED_TOKEN": token})
    command = StdioServerParameters(
        command=sys.executable, args=["-m", "promptsched", "mcp"], env=env, cwd=str(ROOT)
    )
    async with Client(command, read_timeout_seconds=30, mode=mode) as client:
        yield client


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> Any:
    """A tool's answer as JSON; the call must succeed."""
    result = await client.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error, (tool, arguments, text)
    return json.loads(text)


async def refused(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """A tool error's text (never a protocol error, never a traceback)."""
    result = await client.call_tool(tool, arguments)
    text: str = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error, (tool, arguments, text)
    assert "Traceback" not in text and 'File "' not in text, text
    return text


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_tools_are_listed_with_descriptions_and_json_schemas(
    service: Running, transport: str
) -> None:
    token, _ = await _token(service.dsn, _owner("lister"), admin=True)
    async with connect(service, token, transport) as client:
        listed = (await client.list_tools()).tools
        templates = (await client.list_resource_templates()).resource_templates
        status = await call(client, "fleet_status", {})  # an admin token's
        assert status["fleet"]["replicas"] == 1
    async with connect(service, token, transport, mode="legacy") as client:  # initialize
        assert [t.name for t in (await client.list_tools()).tools] == [t.name for t in listed]
    assert {tool.name for tool in listed} == TOOLS
    for tool in listed:
        assert tool.description and "Example" in tool.description, tool.name
        schema = tool.input_schema
        assert schema["type"] == "object" and isinstance(schema["properties"], dict), tool.name
        assert schema["additionalProperties"] is False, tool.name
    by_name = {tool.name: tool for tool in listed}
    create = by_name["create_schedule"].input_schema
    assert {"name", "prompt"} <= set(create["required"])
    assert {"cron", "every", "notify", "notify_when", "output_schema"} <= set(create["properties"])
    assert by_name["place_followup"].input_schema["required"] == ["key", "prompt"]
    assert by_name["show_run"].annotations is not None
    assert by_name["show_run"].annotations.read_only_hint is True
    assert by_name["delete_schedule"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert {t.uri_template for t in templates} == {
        "promptsched://runs/{id}/output", "promptsched://schedules/{id}/runs",
    }  # fmt: skip


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_created_schedule_fires_and_its_output_is_a_resource(
    service: Running, transport: str
) -> None:
    token, _ = await _token(service.dsn, _owner("firer"))
    prompt = f"tick {uuid.uuid4().hex[:6]} " + "long " * 600  # an output past the cut
    async with connect(service, token, transport) as client:
        created = await call(
            client, "create_schedule", {"name": "every second", "every": "1s", "prompt": prompt}
        )

        async def succeeded() -> dict[str, Any] | None:
            page = await call(
                client, "list_runs",
                {"schedule_id": created["id"], "status": "succeeded", "limit": 1},
            )  # fmt: skip
            return page["items"][0] if page["items"] else None

        run = await wait_until(succeeded, timeout=15, interval=0.2, what="a fired run")
        assert run["origin"] == "cadence"  # fired by the scheduler, not triggered
        # A listed output is cut for the context; the resource (and show_run) has it whole.
        assert run["output"].startswith(f"echo: {prompt[:100]}")
        assert run["output"].endswith(f"promptsched://runs/{run['id']}/output]")
        assert len(run["output"]) < len(prompt)
        assert (await call(client, "show_run", {"id": run["id"]}))["output"] == f"echo: {prompt}"
        output = await client.read_resource(f"promptsched://runs/{run['id']}/output")
        assert [c.text for c in output.contents] == [f"echo: {prompt}"]  # type: ignore[union-attr]
        recent = await client.read_resource(f"promptsched://schedules/{created['id']}/runs")
        listed = json.loads(recent.contents[0].text)  # type: ignore[union-attr]
        assert run["id"] in {r["id"] for r in listed}
        offered = {str(r.uri) for r in (await client.list_resources()).resources}
        assert f"promptsched://runs/{run['id']}/output" in offered

        # The other schedule tools, each through its API operation.
        async def two() -> list[dict[str, Any]] | None:
            page = await call(
                client, "list_runs",
                {"schedule_id": created["id"], "status": "succeeded", "limit": 2},
            )  # fmt: skip
            return page["items"] if len(page["items"]) == 2 else None

        newer, older = await wait_until(two, timeout=15, interval=0.2, what="a second run")
        diff = await call(client, "diff_runs", {"id": older["id"], "other": newer["id"]})
        assert diff["kind"] == "text" and diff["changed"] is False
        shown = await call(client, "show_schedule", {"id": created["id"]})
        edited = await call(
            client, "edit_schedule",
            {"id": created["id"], "prompt": "tock", "version": shown["version"]},
        )  # fmt: skip
        assert edited["prompt"] == "tock" and edited["version"] == shown["version"] + 1
        stale = await refused(
            client, "edit_schedule",
            {"id": created["id"], "prompt": "tack", "version": shown["version"]},
        )  # fmt: skip
        assert stale.startswith("Conflict (`version`)")
        paused = await call(client, "pause_schedule", {"id": created["id"], "reason": "quiet"})
        assert paused["enabled"] is False
        assert (await call(client, "resume_schedule", {"id": created["id"]}))["enabled"] is True
        assert await call(client, "delete_schedule", {"id": created["id"]}) == {
            "deleted": True, "schedule_id": created["id"],
        }  # fmt: skip
    assert not await _sql(service.dsn, "SELECT 1 FROM schedules WHERE id = $1", created["id"])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_followup_placed_twice_under_one_key_is_one_and_is_cancelled(
    service: Running, transport: str
) -> None:
    owner = _owner("placer")
    token, _ = await _token(service.dsn, owner)
    body = {"key": "order-4711-unshipped", "in": "24h", "prompt": "Has order {{ order }} "
            "shipped?", "vars": {"order": "4711"}}  # fmt: skip
    async with connect(service, token, transport) as client:
        first = await call(client, "place_followup", body)
        again = await call(client, "place_followup", body)
        assert first["placed"] == "created"
        assert again["placed"] == "already placed with this key and body"
        assert again["followup"]["id"] == first["followup"]["id"]
        other = await refused(client, "place_followup", {**body, "in": "48h"})
        assert "Conflict" in other and "in" in other
        listed = await call(client, "list_followups", {})
        assert [f["key"] for f in listed["items"]] == ["order-4711-unshipped"]
        cancelled = await call(client, "cancel_followup", {"key": "order-4711-unshipped"})
        assert cancelled["followup"]["state"] == "cancelled"
        shown = await call(client, "show_followup", {"key": "order-4711-unshipped"})
        assert shown["state"] == "cancelled"
    rows = await _sql(
        service.dsn, "SELECT state FROM followups WHERE owner = $1 AND key = $2",
        owner, "order-4711-unshipped",
    )  # fmt: skip
    assert [r["state"] for r in rows] == ["cancelled"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_bad_argument_is_a_tool_error_naming_the_argument(
    service: Running, transport: str
) -> None:
    token, _ = await _token(service.dsn, _owner("typo"))
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("create_schedule", {"name": "x", "cron": "61 * * * *", "prompt": "p"}, "cron"),
        ("create_schedule", {"name": "x", "every": "1h", "prompt": "p",
                             "notify_when": "/in_stock =="}, "notify_when"),  # fmt: skip
        ("show_schedule", {"id": "seven"}, "id"),
        ("show_run", {"id": -3}, "id"),
        ("place_followup", {"in": "1h", "prompt": "p"}, "key"),
        ("place_followup", {"key": "k", "in": "soon", "prompt": "p"}, "in"),
        ("preview_schedule", {"expression": "every 15m", "timezone": "Mars/Olympus"},
         "timezone"),
    ]  # fmt: skip
    async with connect(service, token, transport) as client:
        for tool, arguments, field in cases:
            text = await refused(client, tool, arguments)
            assert f"Invalid argument `{field}`" in text, (tool, arguments, text)
            assert f"call {tool} again" in text
        unknown = await refused(
            client, "create_schedule", {"name": "x", "cron": "0 9 * * *", "prompt": "p",
                                        "time_zone": "UTC"},
        )  # fmt: skip
        assert unknown.startswith("Unknown argument `time_zone`") and "`timezone`" in unknown
        # Nothing was stored by any of them.
        assert (await call(client, "list_schedules", {}))["items"] == []
        assert (await call(client, "list_followups", {}))["items"] == []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_another_owners_token_sees_none_of_it(service: Running, transport: str) -> None:
    owner = _owner("alice")
    alice, _ = await _token(service.dsn, owner)
    bob, _ = await _token(service.dsn, _owner("bob"))
    async with connect(service, alice, transport) as client:
        schedule = await call(
            client,
            "create_schedule",
            {"name": "alice's", "cron": "0 0 1 1 *", "prompt": "secret plan"},
        )
        run = await call(client, "trigger_schedule", {"id": schedule["id"]})

        async def finished() -> bool:
            shown = await call(client, "show_run", {"id": run["id"]})
            return shown["status"] == "succeeded"

        await wait_until(finished, timeout=15, interval=0.2, what="the triggered run")
        await call(client, "place_followup", {"key": "alice-key", "in": "1h", "prompt": "p"})
    async with connect(service, bob, transport) as client:
        assert (await call(client, "list_schedules", {}))["items"] == []
        assert (await call(client, "list_runs", {}))["items"] == []
        assert (await call(client, "list_followups", {}))["items"] == []
        assert (await client.list_resources()).resources == []
        for tool, arguments in [
            ("show_schedule", {"id": schedule["id"]}),
            ("edit_schedule", {"id": schedule["id"], "prompt": "bob's now"}),
            ("pause_schedule", {"id": schedule["id"]}),
            ("trigger_schedule", {"id": schedule["id"]}),
            ("delete_schedule", {"id": schedule["id"]}),
            ("show_run", {"id": run["id"]}),
            ("list_runs", {"schedule_id": schedule["id"]}),
            ("diff_runs", {"id": run["id"], "other": run["id"]}),
            ("show_followup", {"key": "alice-key"}),
            ("cancel_followup", {"key": "alice-key"}),
        ]:
            if tool == "list_runs":  # a filter on another's schedule finds nothing
                assert (await call(client, tool, arguments))["items"] == []
                continue
            text = await refused(client, tool, arguments)
            assert text.startswith("Not found"), (tool, text)
            assert "secret plan" not in text
        for uri in (f"promptsched://runs/{run['id']}/output",
                    f"promptsched://schedules/{schedule['id']}/runs"):  # fmt: skip
            with pytest.raises(MCPError, match="not found"):
                await client.read_resource(uri)
        denied = await refused(client, "fleet_status", {})
        assert denied.startswith("Not allowed") and "admin" in denied
    # Alice's things are as she left them.
    rows = await _sql(service.dsn, "SELECT prompt, enabled FROM schedules WHERE id = $1",
                      schedule["id"])  # fmt: skip
    assert [(r["prompt"], r["enabled"]) for r in rows] == [("secret plan", True)]
    states = await _sql(service.dsn, "SELECT state FROM followups WHERE owner = $1", owner)
    assert [r["state"] for r in states] == ["active"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_revoked_token_is_refused_on_the_next_call(
    service: Running, transport: str
) -> None:
    token, token_id = await _token(service.dsn, _owner("carol"))
    async with connect(service, token, transport) as client:
        await call(client, "place_followup", {"key": "before", "in": "1h", "prompt": "p"})
        await _sql(service.dsn, "UPDATE api_tokens SET revoked_at = now() WHERE id = $1",
                   token_id)  # fmt: skip
        arguments = {"key": "after", "in": "1h", "prompt": "p"}
        if transport == "stdio":  # the API refused the token: a tool error that says so
            text = await refused(client, "place_followup", arguments)
            assert text.startswith("The token was refused") and token not in text
        else:  # /mcp itself answers 401, with a JSON-RPC error the client shows
            with pytest.raises(MCPError, match="token is unknown, expired or revoked"):
                await client.call_tool("place_followup", arguments)
            async with create_mcp_http_client() as http:
                answer = await http.post(
                    f"{service.url}/mcp", headers={"Authorization": f"Bearer {token}"},
                    json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"},
                )  # fmt: skip
                stream = await http.get(f"{service.url}/mcp")  # stateless: no stream to open
            assert answer.status_code == 401 and answer.json()["id"] == 7
            assert stream.status_code == 405 and stream.headers["Allow"] == "POST"
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    keys = await _sql(service.dsn, "SELECT key FROM followups WHERE key IN ('before', 'after') "
                      "AND owner LIKE 'carol-%' ORDER BY key")  # fmt: skip
    assert "after" not in [r["key"] for r in keys]


async def test_stdio_without_a_url_works_on_the_database_as_its_operator(dsn: str) -> None:
    """``promptsched mcp`` with no service: the database's operator, who sees every owner's
    schedules and creates as ``--owner``; input is checked as the API checks it."""
    conn = await pools.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO schedules (owner, name, kind, expression, timezone, prompt, provider, "
            "next_fire_at) VALUES ('zoe', 'zoe''s', 'cron', '0 0 1 1 *', 'UTC', 'p', 'echo', "
            "now() + interval '1 day')"
        )
    finally:
        await conn.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    env["PROMPTSCHED_DATABASE_URL"] = dsn
    command = StdioServerParameters(
        command=sys.executable, args=["-m", "promptsched", "mcp", "--owner", "ops"], env=env,
        cwd=str(ROOT),
    )  # fmt: skip
    async with Client(command, read_timeout_seconds=30) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
        created = await call(
            client, "create_schedule", {"name": "nightly", "cron": "0 3 * * *", "prompt": "p"}
        )
        assert created["owner"] == "ops"
        listed = await call(client, "list_schedules", {})
        assert sorted(s["owner"] for s in listed["items"]) == ["ops", "zoe"]
        text = await refused(client, "create_schedule", {"name": "x", "every": "0s", "prompt": "p"})
        assert text.startswith("Invalid argument `every`")
        assert "replicas" in await call(client, "fleet_status", {})
