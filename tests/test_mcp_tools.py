"""MCP tools with a real stdio MCP server started by the suite (tests/fakes/mcp_server.py,
written with the ``mcp`` SDK): its read-only tool is used by an agent run; a tool not marked
read-only is refused unless the operator opts it in; configuration errors name their key."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched import netguard
from promptsched.clock import FrozenClock
from promptsched.config import WorkerSettings
from promptsched.errors import ConfigError, ValidationError
from promptsched.executors.providers import build_registry
from promptsched.executors.settings import parse_providers
from promptsched.metrics import Metrics
from promptsched.roles.worker import WorkerPool
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.tools.registry import ToolRegistry
from promptsched.tools.settings import parse_mcp_servers
from tests.factories import EPOCH
from tests.fakes import openai_server as fake_server
from tests.test_providers_integration import fake_run, provider_env

SERVER = Path(__file__).parent / "fakes" / "mcp_server.py"


def kb_settings(**extra: Any) -> str:
    return json.dumps({"kb": {"command": [sys.executable, str(SERVER)], **extra}})


@asynccontextmanager
async def connected(**extra: Any) -> AsyncIterator[ToolRegistry]:
    registry = ToolRegistry.from_settings(
        allow=netguard.NO_TOOLS_ALLOW, mcp=parse_mcp_servers(kb_settings(**extra))
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(registry.run)
            yield registry
            tg.cancel_scope.cancel()
    finally:
        await registry.aclose()


async def test_a_read_only_mcp_tool_is_used_by_an_agent_run_and_others_are_refused(
    pool: asyncpg.Pool[Any],
) -> None:
    async with connected() as tools, fake_server.start_fake_openai() as fake:
        catalog = tools.catalog()
        assert catalog.unavailable == {}
        assert catalog.tools["kb.lookup"] is None and catalog.tools["kb.broken"] is None
        refusal = catalog.tools["kb.write_note"]
        assert refusal is not None and "not marked read-only" in refusal
        assert "allow = ['write_note'] under [mcp.kb]" in refusal
        with pytest.raises(ValidationError, match="not marked read-only"):
            tools.resolve(["kb.write_note"])

        fake.script(
            fake_server.tool_calls(
                ("kb__lookup", {"key": "capital of France"}), ("kb__broken", {"key": "x"})
            ),
            fake_server.ok("Paris."),
        )
        rid = await fake_run(pool, prompt="Capital?", params={"tools": ["kb.lookup", "kb.broken"]})
        registry, limiters = build_registry(parse_providers(provider_env(fake.base_url)), tools)
        clock, metrics = FrozenClock(EPOCH), Metrics()
        heartbeat = Heartbeat(pool, clock, metrics, lease=timedelta(seconds=30),
                              interval=timedelta(seconds=10))  # fmt: skip
        workers = WorkerPool(
            pool,
            clock,
            metrics,
            registry,
            limiters,
            heartbeat,
            WorkerSettings(slots=1, worker_id="w"),
        )
        try:
            assert await workers.run_once() == 1
        finally:
            await registry.aclose()

    run = await pool.fetchrow("SELECT * FROM runs WHERE id = $1", rid)
    assert (run["status"], run["output"]) == ("succeeded", "Paris.")
    first, second = (request.json for request in fake.requests)
    names = [spec["function"]["name"] for spec in first["tools"]]
    assert names == ["kb__lookup", "kb__broken"]
    assert first["tools"][0]["function"]["description"] == "Look a fact up by its key."
    assert first["tools"][0]["function"]["parameters"]["required"] == ["key"]
    lookup, broken = second["messages"][-2:]
    assert (lookup["tool_call_id"], lookup["content"]) == ("call_1", "Paris")
    assert broken["content"].startswith("error: ") and "is corrupt" in broken["content"]
    transcript = await pool.fetchval("SELECT transcript FROM run_attempts WHERE run_id = $1", rid)
    results = [step for step in transcript if step["kind"] == "tool_result"]
    assert [(s["tool"], s["error"]) for s in results] == [("kb.lookup", False), ("kb.broken", True)]


async def test_an_operator_can_opt_in_a_tool_that_is_not_read_only() -> None:
    async with connected(allow=["write_note"]) as tools:
        assert tools.catalog().tools["kb.write_note"] is None
        (tool,) = tools.resolve(["kb.write_note"])
        assert tool.read_only is False
        assert await tool.call({"text": "hello"}) == "stored 5 characters"


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("[1]", "PROMPTSCHED_MCP_SERVERS", "a table of [mcp.NAME] tables"),
        ("{not json", "PROMPTSCHED_MCP_SERVERS", "must be a JSON object"),
        ('{"kb": {}}', "PROMPTSCHED_MCP_SERVERS.kb", "either command"),
        ('{"kb": {"url": "x", "command": ["y"]}}', "PROMPTSCHED_MCP_SERVERS.kb", "either"),
        ('{"kb": {"url": "ftp://x"}}', "PROMPTSCHED_MCP_SERVERS.kb.url", "not an http(s) URL"),
        ('{"kb": {"command": []}}', "PROMPTSCHED_MCP_SERVERS.kb.command", "must be a list"),
        ('{"kb": {"command": ["x"], "allowed": []}}', "PROMPTSCHED_MCP_SERVERS.kb.allowed",
         "did you mean 'allow'"),
        ('{"kb": {"command": ["x"], "allow": "all"}}', "PROMPTSCHED_MCP_SERVERS.kb.allow",
         "list of tool names"),
        ('{"K.B": {"command": ["x"]}}', "PROMPTSCHED_MCP_SERVERS.K.B", "lowercase"),
        ('{"kb": {"command": ["x"], "timeout": "soon"}}', "PROMPTSCHED_MCP_SERVERS.kb.timeout",
         "not a duration"),
    ],
)  # fmt: skip
def test_mcp_configuration_errors_name_the_key(text: str, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_mcp_servers(text)
    assert raised.value.field == field
    assert message in raised.value.message


def test_mcp_servers_come_from_toml_and_the_environment_overrides_by_name() -> None:
    toml = {"kb": {"command": ["kb-server", "--ro"], "read_only": ["search"]},
            "web": {"url": "http://127.0.0.1:9000/mcp", "timeout": "5s"}}  # fmt: skip
    servers = parse_mcp_servers('{"kb": {"command": "other-kb"}}', toml)
    assert servers["kb"].command == ("other-kb",) and servers["kb"].read_only == frozenset()
    assert servers["web"].url == "http://127.0.0.1:9000/mcp"
    assert servers["web"].timeout == timedelta(seconds=5)


def test_the_cli_checks_a_schedules_tools_against_the_mcp_servers(
    dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from promptsched import cli

    env = {
        **provider_env("http://127.0.0.1:9/v1"),
        "PROMPTSCHED_DATABASE_URL": dsn,
        "PROMPTSCHED_MCP_SERVERS": kb_settings(),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    add = ["schedules", "add", "--name", "kb", "--cron", "0 9 * * *", "--prompt", "Capital?",
           "--provider", "fake", "--json"]  # fmt: skip
    assert cli.main([*add, "--param", "tools=http_get,kb.write_note"]) == 2
    assert "params.tools[1]: tool 'kb.write_note' is not marked read-only" in (
        capsys.readouterr().err
    )
    assert cli.main([*add, "--param", "tools=http_get,kb.lookup", "--param", "max_steps=3"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["params"] == {"tools": "http_get,kb.lookup", "max_steps": "3"}
