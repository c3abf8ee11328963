"""Issue 8: agent runs of the ``openai`` provider through a real WorkerPool and Postgres,
against the fake OpenAI-compatible server scripted to ask for tool calls and a local web site
for the built-in tools: the loop, its budgets, failing and hanging tools, the transcript and
the progress events, and the save-time checks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from promptsched import netguard
from promptsched.clock import Clock, FrozenClock
from promptsched.config import WorkerSettings
from promptsched.errors import ValidationError
from promptsched.executors.providers import build_registry
from promptsched.executors.settings import parse_providers
from promptsched.metrics import Metrics
from promptsched.ops import inputs
from promptsched.roles.worker import WorkerPool
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.store import listen
from promptsched.store import pool as pools
from promptsched.tools.registry import ToolRegistry
from tests.factories import EPOCH, attempt_rows, run_row
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.helpers import wait_until
from tests.test_providers_integration import PROVIDER, fake_run, provider_env

PROMPT = "What is the weather at the harbour?"


@asynccontextmanager
async def agent_workers(
    pool: asyncpg.Pool[Any], clock: Clock, base_url: str, *, request_timeout: str = "10s"
) -> AsyncIterator[WorkerPool]:
    """A WorkerPool whose ``fake`` provider runs agent schedules with the built-in tools
    (allowed to reach the loopback site)."""
    tools = ToolRegistry.from_settings(
        allow=netguard.Allowlist.parse("127.0.0.1", variable=netguard.TOOLS_ALLOW)
    )
    registry, limiters = build_registry(
        parse_providers(provider_env(base_url, timeout=request_timeout)), tools
    )
    metrics = Metrics()
    lease = timedelta(seconds=30)
    heartbeat = Heartbeat(pool, clock, metrics, lease=lease, interval=lease / 3)
    try:
        yield WorkerPool(
            pool, clock, metrics, registry, limiters, heartbeat, WorkerSettings(slots=4,
            worker_id="agent-worker", retry_base=timedelta(milliseconds=100)))  # fmt: skip
    finally:
        await registry.aclose()
        await tools.aclose()


def _kinds(transcript: list[dict[str, Any]]) -> list[str]:
    return [step["kind"] for step in transcript]


async def _agent_run(pool: asyncpg.Pool[Any], params: dict[str, Any], **fields: Any) -> int:
    return await fake_run(pool, prompt=PROMPT, params=params, **fields)


async def test_a_two_step_run_reads_a_local_page_with_http_get_then_answers(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI, pages: site.Pages, dsn: str
) -> None:
    events: list[dict[str, Any]] = []
    listener = await pools.connect(dsn)
    await listener.add_listener(
        listen.CHANNEL_PROGRESS, lambda *args: events.append(json.loads(args[3]))
    )
    fake.script(
        fake_server.tool_calls(("http_get", {"url": pages.url("/page")})),
        fake_server.ok("Sunny and warm; high tide at 09:12."),
    )
    rid = await _agent_run(pool, {"tools": ["http_get"], "max_steps": 4, "temperature": 0})
    try:
        async with agent_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
            assert await workers.run_once() == 1
        run = await run_row(pool, rid)
        (attempt,) = await attempt_rows(pool, rid)

        async def all_published() -> bool:
            return len(events) >= len(attempt["transcript"])

        await wait_until(all_published, timeout=5, what="a progress event per step")
    finally:
        await listener.close()

    assert (run["status"], run["output"]) == ("succeeded", "Sunny and warm; high tide at 09:12.")
    assert run["usage"] == {
        "prompt_tokens": 14, "completion_tokens": 6, "total_tokens": 20, "steps": 2,
        "tool_calls": 1,
    }  # fmt: skip
    assert pages.paths == ["/page"]
    first, second = (request.json for request in fake.requests)
    assert first["messages"] == [{"role": "user", "content": PROMPT}]
    assert first["temperature"] == 0 and "max_steps" not in first
    (spec,) = first["tools"]
    assert spec["function"]["name"] == "http_get"
    assert spec["function"]["parameters"]["required"] == ["url"]
    user, assistant, tool = second["messages"]
    assert assistant["tool_calls"][0]["function"]["name"] == "http_get"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_1"
    assert "Sunny and warm" in tool["content"] and "do not read me" not in tool["content"]

    transcript = attempt["transcript"]
    assert attempt["status"] == "succeeded"
    assert _kinds(transcript) == ["start", "model", "tool_call", "tool_result", "model"]
    start, call, _, result, answer = transcript
    assert start["messages"] == [{"role": "user", "content": PROMPT}]
    assert start["tools"] == ["http_get"]
    assert call["tool_calls"] == [
        {"id": "call_1", "tool": "http_get", "arguments": json.dumps({"url": pages.url("/page")})}
    ]
    assert call["text"] == "step 1/4: the model calls http_get" and call["tokens"] == 10
    assert result["tool"] == "http_get" and result["error"] is False
    assert "Sunny and warm" in result["result"] and result["ms"] >= 0
    assert answer["content"] == run["output"] and answer["tokens"] == 20
    assert all(step["at"] for step in transcript)

    assert [(e["run_id"], e["attempt"], e["step"], e["kind"]) for e in events] == [
        (rid, 1, step["step"], step["kind"]) for step in transcript
    ]
    assert events[2]["text"].startswith(f'calling http_get {{"url": "{pages.url("/page")}')
    assert {e["max_steps"] for e in events} == {4}


@pytest.mark.parametrize(
    ("params", "timeout", "script", "error"),
    [
        pytest.param(
            {"tools": ["http_get"], "max_steps": 2}, 30, [], "agent: step budget of 2 exceeded",
            id="steps",
        ),
        pytest.param(
            {"tools": ["http_get"], "max_tokens_total": 15}, 30, [],
            "agent: token budget of 15 exceeded (20 tokens used)", id="tokens",
        ),
        pytest.param(
            {"tools": ["http_get"]}, 1, [fake_server.hang()],
            "agent: time budget of 1s exceeded (the schedule's timeout)", id="time",
        ),
    ],
)  # fmt: skip
async def test_an_exceeded_budget_ends_the_run_dead_at_once(
    pool: asyncpg.Pool[Any],
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
    params: dict[str, Any],
    timeout: int,
    script: list[fake_server.Behaviour],
    error: str,
) -> None:
    # The model never stops asking for the page.
    fake.default = fake_server.tool_calls(("http_get", {"url": pages.url("/page")}))
    fake.script(*script)
    rid = await _agent_run(pool, params, timeout=timedelta(seconds=timeout), max_attempts=3)
    async with agent_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("dead", 1)  # permanent: not retried
    assert run["error"].startswith(error), run["error"]
    (attempt,) = await attempt_rows(pool, rid)
    assert (attempt["status"], attempt["error"]) == ("failed", run["error"])
    assert _kinds(attempt["transcript"])[0] == "start"


@pytest.mark.parametrize(
    ("call", "told"),
    [
        pytest.param(("http_get", {"url": "/status/500"}), "HTTP 500 Internal Server Error",
                     id="http-error"),
        pytest.param(("http_get", '{"url": '), "the arguments are not valid JSON", id="bad-json"),
        pytest.param(("delete_everything", {}), "there is no tool 'delete_everything' "
                     "(available: http_get)", id="unknown-tool"),
    ],
)  # fmt: skip
async def test_a_failing_tool_call_is_told_to_the_model_and_the_run_goes_on(
    pool: asyncpg.Pool[Any],
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
    call: tuple[str, Any],
    told: str,
) -> None:
    name, arguments = call
    if isinstance(arguments, dict) and "url" in arguments:
        arguments = {"url": pages.url(arguments["url"])}
    fake.script(fake_server.tool_calls((name, arguments)), fake_server.ok("I could not look."))
    rid = await _agent_run(pool, {"tools": ["http_get"]})
    async with agent_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["output"]) == ("succeeded", "I could not look.")
    tool_message = fake.requests[1].json["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"].startswith("error: ") and told in tool_message["content"]
    (attempt,) = await attempt_rows(pool, rid)
    result = attempt["transcript"][3]
    assert (result["kind"], result["error"]) == ("tool_result", True)
    assert told in result["result"]


async def test_a_hanging_tool_call_times_out_and_the_run_goes_on(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI, pages: site.Pages
) -> None:
    fake.script(
        fake_server.tool_calls(("http_get", {"url": pages.url("/hang")})),
        fake_server.ok("The page did not answer."),
    )
    rid = await _agent_run(pool, {"tools": ["http_get"], "tool_timeout": "300ms"})
    async with agent_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["output"]) == ("succeeded", "The page did not answer.")
    assert pages.hanging == 1
    tool_message = fake.requests[1].json["messages"][-1]
    assert tool_message["content"] == "error: the tool call timed out after 300ms"
    (attempt,) = await attempt_rows(pool, rid)
    result = attempt["transcript"][3]
    assert result["error"] is True and 300 <= result["ms"] < 5000


async def test_a_tool_no_longer_offered_fails_the_run_permanently(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    rid = await _agent_run(pool, {"tools": ["kb.search"]})  # saved when kb was configured
    async with agent_workers(pool, FrozenClock(EPOCH), fake.base_url) as workers:
        assert await workers.run_once() == 1
    run = await run_row(pool, rid)
    assert (run["status"], run["attempts"]) == ("dead", 1)
    assert run["error"].startswith("agent: params.tools[0]: unknown tool 'kb.search'")
    assert fake.requests == []


async def test_the_webhook_provider_sends_one_idempotency_key_on_every_attempt(
    pool: asyncpg.Pool[Any], fake: fake_server.FakeOpenAI
) -> None:
    env = {
        "PROMPTSCHED_PROVIDERS": "hook",
        "PROMPTSCHED_PROVIDER_HOOK_KIND": "webhook",
        "PROMPTSCHED_PROVIDER_HOOK_BASE_URL": fake.webhook_url,
    }
    loopback = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)
    registry, limiters = build_registry(parse_providers(env), webhook_allow=loopback)
    rid = await fake_run(pool, max_attempts=3)
    await pool.execute("UPDATE runs SET provider = 'hook' WHERE id = $1", rid)
    fake.script(fake_server.status(503), fake_server.status(502))
    clock = FrozenClock(EPOCH)
    metrics = Metrics()
    heartbeat = Heartbeat(pool, clock, metrics, lease=timedelta(seconds=30),
                          interval=timedelta(seconds=10))  # fmt: skip
    workers = WorkerPool(
        pool,
        clock,
        metrics,
        registry,
        limiters,
        heartbeat,
        WorkerSettings(
            slots=1,
            worker_id="w",
            retry_base=timedelta(milliseconds=1),
            retry_max=timedelta(milliseconds=1),
        ),
    )
    try:
        for _ in range(3):
            assert await workers.run_once() == 1
            clock.advance(timedelta(seconds=1))
    finally:
        await registry.aclose()
    assert (await run_row(pool, rid))["status"] == "succeeded"
    keys = [request.headers["Idempotency-Key"] for request in fake.requests]
    assert keys == [f"promptsched-run-{rid}"] * 3
    assert len({request.json["attempt_id"] for request in fake.requests}) == 3


# --- save-time checks -------------------------------------------------------------------------


KINDS = {PROVIDER: "openai", "echo": "echo"}


def _raw(params: dict[str, Any], provider: str = PROVIDER) -> dict[str, Any]:
    return {"name": "agent", "cron": "0 9 * * *", "prompt": PROMPT, "provider": provider,
            "params": params}  # fmt: skip


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"tools": ["http_get", "nope"]}, "params.tools[1]", "unknown tool 'nope'"),
        ({"tools": "http_get"}, None, None),
        ({"tools": ["kb.write"]}, "params.tools[0]", "not marked read-only"),
        ({"tools": ["rss", "rss"]}, "params.tools[1]", "listed twice"),
        ({"tools": {"a": 1}}, "params.tools", "must be a list"),
        ({"tools": ["rss"], "max_steps": 0}, "params.max_steps", "between 1 and 50"),
        ({"tools": ["rss"], "max_steps": "8"}, None, None),
        ({"tools": ["rss"], "max_tokens_total": 1.5}, "params.max_tokens_total", "whole"),
        ({"tools": ["rss"], "tool_timeout": "1h"}, "params.tool_timeout", "between 100ms"),
        ({"tools": ["rss"], "temperature": "hot"}, "params.temperature", "number"),
    ],
)
def test_agent_params_are_checked_when_a_schedule_is_saved(
    params: dict[str, Any], field: str | None, message: str | None
) -> None:
    catalog = ToolRegistry.from_settings(allow=netguard.NO_TOOLS_ALLOW).catalog()
    catalog = type(catalog)(
        {**catalog.tools, "kb.write": "tool 'kb.write' is not marked read-only"}
    )
    if field is None:
        inputs.validate(_raw(params), providers=KINDS, provider_kinds=KINDS, tools=catalog)
        return
    with pytest.raises(ValidationError) as raised:
        inputs.validate(_raw(params), providers=KINDS, provider_kinds=KINDS, tools=catalog)
    assert raised.value.field == field
    assert message is not None and message in raised.value.message


def test_tools_need_an_llm_api_provider() -> None:
    with pytest.raises(ValidationError, match="need a provider of kind openai, anthropic, gemini"):
        inputs.validate(_raw({"tools": ["rss"]}, "echo"), providers=KINDS, provider_kinds=KINDS)
