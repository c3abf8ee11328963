"""The ``anthropic`` and ``gemini`` executors (docs/providers.md, "The anthropic provider",
"The gemini provider"): against a real LiteLLM proxy's Anthropic-format (``/v1/messages``,
``x-api-key``) and Gemini-format (``/v1beta/models/{model}:generateContent``,
``x-goog-api-key``) endpoints serving a ``mock_response`` model, and against a server of ours
(tests/fakes/native_llm.py) only for what the proxy cannot produce: a 529, Anthropic's
rate-limit headers, ``RetryInfo``, a forced tool-use answer, tool calls, cache usage."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from promptsched import netguard
from promptsched.errors import PermanentError, RetryableError, Throttled, ValidationError
from promptsched.executors import anthropic, gemini, probe
from promptsched.executors.base import ExecutionRequest
from promptsched.executors.chat import ChatExecutor
from promptsched.executors.providers import build_executor
from promptsched.executors.settings import ProviderSettings, parse_providers
from promptsched.ops import inputs, probes
from promptsched.secret import Secret
from promptsched.tools.base import Tool
from tests import litellm_support
from tests.fakes import native_llm
from tests.helpers import executor_failure

MOCK_TEXT = "hello from the mock"  # tests/litellm_support.py: the mock model's answer
SCHEMA = {
    "type": "object",
    "title": "Weather report",
    "properties": {"city": {"type": "string"}, "rain": {"type": "boolean"}},
    "required": ["city", "rain"],
    "additionalProperties": False,
}


def settings(kind: str, base_url: str, key: str, **overrides: Any) -> ProviderSettings:
    values: dict[str, Any] = {
        "name": kind, "kind": kind, "base_url": base_url, "api_key": Secret(key),
        "api_key_env": "TEST_KEY", "default_model": "mock",
        "connect_timeout": timedelta(seconds=2), "request_timeout": timedelta(seconds=10),
        **overrides,
    }  # fmt: skip
    return ProviderSettings(**values)


def request(**overrides: Any) -> ExecutionRequest:
    values: dict[str, Any] = {
        "run_id": 41, "schedule_id": 7, "schedule_name": "harbour weather",
        "attempt_id": uuid.uuid4(), "attempt": 1,
        "slot": datetime(2026, 11, 2, 9, 0, tzinfo=UTC), "timezone": "Europe/Paris",
        "prompt": "Is it raining at the harbour?", **overrides,
    }  # fmt: skip
    return ExecutionRequest(**values)


def executor(provider: ProviderSettings, tools: Any = None) -> ChatExecutor:
    built = build_executor(provider, tools)
    assert isinstance(built, ChatExecutor)
    return built


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[litellm_support.LiteLLMProxy]:
    running = litellm_support.LiteLLMProxy(tmp_path_factory.mktemp("litellm"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def root(proxy: litellm_support.LiteLLMProxy) -> str:
    """The proxy's root (the native kinds' base_url: they add /v1/... and /v1beta/...)."""
    await proxy.ready()
    return proxy.base_url.removesuffix("/v1")


@pytest.fixture
async def native() -> AsyncIterator[native_llm.NativeLLM]:
    async with native_llm.start_native_llm() as server:
        yield server


# --- through the real LiteLLM proxy --------------------------------------------------------------

_WIRE = {
    "anthropic": ("/v1/messages", "x-api-key",
                  {"model": "mock", "max_tokens": 4096,
                   "messages": [{"role": "user", "content": "Is it raining at the harbour?"}]}),
    "gemini": ("/v1beta/models/mock:generateContent", "x-goog-api-key",
               {"contents": [{"role": "user",
                              "parts": [{"text": "Is it raining at the harbour?"}]}]}),
}  # fmt: skip


async def _reported_usage(root: str, kind: str) -> dict[str, int]:
    """What the proxy itself answers to the same request, read by hand."""
    path, header, body = _WIRE[kind]
    async with aiohttp.ClientSession() as http:
        async with http.post(root + path, json=body, headers={header: "sk-free"}) as reply:
            assert reply.status == 200
            data = await reply.json()
    if kind == "anthropic":
        usage = data["usage"]
        assert set(usage) == {"input_tokens", "output_tokens"}, usage
        prompt, completion = usage["input_tokens"], usage["output_tokens"]
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}  # fmt: skip
    usage = data["usageMetadata"]
    return {"prompt_tokens": usage["promptTokenCount"],
            "completion_tokens": usage["candidatesTokenCount"],
            "total_tokens": usage["totalTokenCount"]}  # fmt: skip


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
async def test_a_run_through_the_proxy_answers_the_mock_text_with_the_usage_it_reported(
    root: str, kind: str
) -> None:
    async with aclosing(executor(settings(kind, root, "sk-free"))) as running:
        result = await running.execute(request())
    assert result.output == MOCK_TEXT
    assert result.usage == await _reported_usage(root, kind)


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
async def test_a_refused_key_through_the_proxy_is_permanent_and_never_shown(
    root: str, kind: str
) -> None:
    key = "sk-refused-0123456789-never-print-me"
    async with aclosing(executor(settings(kind, root, key))) as running:
        error = await executor_failure(running, request(), secret=key)
    assert type(error) is PermanentError and "HTTP 401" in error.message, error


async def test_a_key_limit_on_the_proxys_messages_endpoint_is_throttling(root: str) -> None:
    """``sk-tiny`` is allowed one request per window: the next is a 429, which is weather."""
    async with aclosing(executor(settings("anthropic", root, "sk-tiny"))) as running:
        first = await running.execute(request())
        assert first.output == MOCK_TEXT
        error = await executor_failure(running, request(), secret="sk-tiny")
    assert type(error) is Throttled and "HTTP 429" in error.message, error


async def test_doctor_asks_anthropic_for_its_models_with_the_key(root: str) -> None:
    ok = await probe.probe(settings("anthropic", root, "sk-free"), netguard.NO_WEBHOOK_ALLOW)
    assert ok.ok and "/v1/models answered 200" in ok.message and "2 models" in ok.message
    wrong = await probe.probe(settings("anthropic", root, "sk-wrong"), netguard.NO_WEBHOOK_ALLOW)
    assert wrong.ok is False and wrong.status == 401 and "sk-wrong" not in wrong.message
    assert wrong.key_refused


# --- Anthropic: what the proxy cannot produce ----------------------------------------------------


async def test_anthropic_sends_its_headers_system_and_max_tokens(
    native: native_llm.NativeLLM,
) -> None:
    provider = settings("anthropic", native.base_url, native.key, api_version="2024-01-01")
    params = {"system": "Answer in one line.", "temperature": "0.3", "stop": "END"}
    async with aclosing(executor(provider)) as running:
        result = await running.execute(request(params=params, model="claude-sonnet-4-5"))
        await running.execute(request(params={"max_tokens": 64}))
    assert result.output == "hello"
    sent, second = native.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == native.key and "Authorization" not in sent.headers
    assert sent.headers["anthropic-version"] == "2024-01-01"
    assert sent.json == {
        "model": "claude-sonnet-4-5", "system": "Answer in one line.",
        "messages": [{"role": "user",
                      "content": [{"type": "text", "text": "Is it raining at the harbour?"}]}],
        "max_tokens": anthropic.DEFAULT_MAX_TOKENS, "temperature": 0.3, "stop_sequences": ["END"],
    }  # fmt: skip
    assert second.json["max_tokens"] == 64


async def test_anthropic_text_blocks_are_joined_and_cache_tokens_counted(
    native: native_llm.NativeLLM,
) -> None:
    native.script(native_llm.anthropic_text(
        "Rain ", "until noon.", input_tokens=20, output_tokens=7,
        cache_creation_input_tokens=100, cache_read_input_tokens=900,
    ))  # fmt: skip
    async with aclosing(executor(settings("anthropic", native.base_url, native.key))) as running:
        result = await running.execute(request())
    assert result.output == "Rain until noon."
    assert native.requests[0].headers["anthropic-version"] == anthropic.DEFAULT_ANTHROPIC_VERSION
    assert result.usage == {
        "prompt_tokens": 1020, "completion_tokens": 7, "total_tokens": 1027,
        "cache_creation_input_tokens": 100, "cache_read_input_tokens": 900,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "kind", "retry_after", "says"),
    [
        (native_llm.anthropic_overloaded(), Throttled, None, "HTTP 529 Overloaded: Overloaded"),
        (native_llm.anthropic_error(503, "api_error", "Service unavailable"), Throttled, None,
         "HTTP 503"),
        (native_llm.anthropic_rate_limited("7", "2099-01-01T00:00:00Z"), Throttled, 7.0,
         "rate limit"),
        (native_llm.anthropic_error(500, "api_error", "Internal server error"), RetryableError,
         None, "HTTP 500"),
        (native_llm.anthropic_error(400, "invalid_request_error",
                                    "max_tokens: 100000 > 64000, the maximum for this model"),
         PermanentError, None, "HTTP 400 Bad Request: max_tokens: 100000 > 64000"),
        (native_llm.anthropic_error(403, "permission_error", "Your API key does not have "
                                    "permission to use the specified resource."),
         PermanentError, None, "HTTP 403"),
    ],
)  # fmt: skip
async def test_anthropic_errors_become_weather_or_failures(
    native: native_llm.NativeLLM,
    answer: native_llm.Answer,
    kind: type[Exception],
    retry_after: float | None,
    says: str,
) -> None:
    native.script(answer)
    async with aclosing(executor(settings("anthropic", native.base_url, native.key))) as running:
        error = await executor_failure(running, request(), secret=native.key)
    assert type(error) is kind and says in error.message, error
    assert error.retry_after == retry_after
    if answer.status == 429:  # anthropic-ratelimit-requests-remaining: 0 paces until its reset
        assert error.pace is not None and error.pace.header == "anthropic-ratelimit-requests-reset"


async def test_anthropic_answers_in_a_schema_through_one_forced_tool(
    native: native_llm.NativeLLM,
) -> None:
    native.script(native_llm.anthropic_tool_use("Weather_report", {"city": "Brest", "rain": True}))
    async with aclosing(executor(settings("anthropic", native.base_url, native.key))) as running:
        result = await running.execute(request(output_schema=SCHEMA))
    assert result.data == {"city": "Brest", "rain": True}
    assert json.loads(result.output) == result.data
    sent = native.requests[0].json
    assert sent["tools"] == [{"name": "Weather_report", "description": anthropic.ANSWER_DESCRIPTION,
                              "input_schema": SCHEMA}]  # fmt: skip
    assert sent["tool_choice"] == {"type": "tool", "name": "Weather_report"}


async def test_an_anthropic_answer_outside_the_schema_is_asked_again_then_checked(
    native: native_llm.NativeLLM,
) -> None:
    native.script(
        native_llm.anthropic_tool_use("Weather_report", {"city": "Brest"}),
        native_llm.anthropic_tool_use("Weather_report", {"city": "Brest", "rain": False}),
    )
    async with aclosing(executor(settings("anthropic", native.base_url, native.key))) as running:
        result = await running.execute(request(output_schema=SCHEMA))
    assert result.data == {"city": "Brest", "rain": False}
    again = native.requests[1].json["messages"]
    assert [turn["role"] for turn in again] == ["user", "assistant", "user"]
    assert "'rain' is a required property" in again[2]["content"][0]["text"]


class _Tides:
    """One read-only tool the model may call."""

    name = "tides.today"
    description = "Today's tides at a harbour."
    parameters: Mapping[str, Any] = {
        "type": "object", "properties": {"harbour": {"type": "string"}}, "required": ["harbour"],
    }  # fmt: skip
    read_only = True

    def __init__(self) -> None:
        self.calls: list[Mapping[str, Any]] = []

    async def call(self, arguments: Mapping[str, Any]) -> str:
        self.calls.append(arguments)
        return f"high tide at {arguments['harbour']}: 14:02"


class _Tools:
    def __init__(self, tool: _Tides) -> None:
        self.tool = tool

    def resolve(self, names: Sequence[str]) -> list[Tool]:
        return [self.tool]


async def test_an_anthropic_agent_run_calls_our_tool_through_tool_use(
    native: native_llm.NativeLLM,
) -> None:
    tides = _Tides()
    native.script(
        native_llm.anthropic_tool_use("tides__today", {"harbour": "Brest"}),
        native_llm.anthropic_text("High tide at 14:02."),
    )
    provider = settings("anthropic", native.base_url, native.key)
    async with aclosing(executor(provider, _Tools(tides))) as running:
        result = await running.execute(request(params={"tools": ["tides.today"]}, timeout=20))
    assert result.output == "High tide at 14:02." and tides.calls == [{"harbour": "Brest"}]
    first, second = (r.json for r in native.requests)
    assert first["tools"] == [{"name": "tides__today", "description": _Tides.description,
                               "input_schema": _Tides.parameters}]  # fmt: skip
    assert "tool_choice" not in first
    assert second["messages"][1] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "tides__today",
         "input": {"harbour": "Brest"}}]}  # fmt: skip
    assert second["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
         "content": "high tide at Brest: 14:02"}]}  # fmt: skip
    assert result.usage is not None and result.usage["steps"] == 2


async def test_an_anthropic_agent_run_with_a_schema_ends_with_the_answer_tool(
    native: native_llm.NativeLLM,
) -> None:
    """Among the agent's tools, the answer tool is offered with tool_choice "any": the model
    calls tools until it calls the answer tool, whose input is the checked answer."""
    tides = _Tides()
    native.script(
        native_llm.anthropic_tool_use("tides__today", {"harbour": "Brest"}),
        native_llm.anthropic_tool_use("Weather_report", {"city": "Brest", "rain": False}),
    )
    provider = settings("anthropic", native.base_url, native.key)
    async with aclosing(executor(provider, _Tools(tides))) as running:
        result = await running.execute(
            request(params={"tools": ["tides.today"]}, output_schema=SCHEMA, timeout=20)
        )
    assert result.data == {"city": "Brest", "rain": False} and len(tides.calls) == 1
    for sent in (r.json for r in native.requests):
        assert sent["tool_choice"] == {"type": "any"}
        assert [tool["name"] for tool in sent["tools"]] == ["tides__today", "Weather_report"]


# --- Gemini: what the proxy cannot produce -------------------------------------------------------


async def test_gemini_sends_its_key_system_instruction_and_generation_config(
    native: native_llm.NativeLLM,
) -> None:
    params = {"system": "Answer in one line.", "temperature": 0.2, "max_tokens": "80",
              "stop": ["END"], "top_k": 40}  # fmt: skip
    provider = settings("gemini", native.base_url, native.key)
    async with aclosing(executor(provider)) as running:
        result = await running.execute(request(params=params, model="gemini-2.5-flash"))
    assert result.output == "hello from gemini"
    assert result.usage == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    sent = native.requests[0]
    assert sent.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert sent.headers["x-goog-api-key"] == native.key and "Authorization" not in sent.headers
    assert sent.json == {
        "contents": [{"role": "user", "parts": [{"text": "Is it raining at the harbour?"}]}],
        "systemInstruction": {"parts": [{"text": "Answer in one line."}]},
        "generationConfig": {"temperature": 0.2, "maxOutputTokens": 80,
                             "stopSequences": ["END"], "topK": 40},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "kind", "retry_after", "says"),
    [
        (native_llm.gemini_exhausted("2.5s"), Throttled, 2.5, "exceeded your current quota"),
        (native_llm.gemini_error(503, "UNAVAILABLE", "The model is overloaded. Please try "
                                 "again later."), Throttled, None, "overloaded"),
        (native_llm.gemini_error(500, "INTERNAL", "An internal error has occurred."),
         RetryableError, None, "HTTP 500"),
        (native_llm.gemini_error(400, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: "
                                 "contents is not specified"), PermanentError, None,
         "HTTP 400 Bad Request: * GenerateContentRequest.contents"),
        (native_llm.gemini_error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered "
                                 "callers."), PermanentError, None, "HTTP 403"),
    ],
)  # fmt: skip
async def test_gemini_errors_become_weather_or_failures(
    native: native_llm.NativeLLM,
    answer: native_llm.Answer,
    kind: type[Exception],
    retry_after: float | None,
    says: str,
) -> None:
    native.script(answer)
    async with aclosing(executor(settings("gemini", native.base_url, native.key))) as running:
        error = await executor_failure(running, request(), secret=native.key)
    assert type(error) is kind and error.retry_after == retry_after, error
    assert says in error.message and (retry_after is None or "retry after" in error.message)


def test_retry_info_is_read_only_from_a_retry_info_detail() -> None:
    assert gemini.retry_delay(json.dumps(native_llm.gemini_exhausted("34s").body)) == 34.0
    assert gemini.retry_delay(json.dumps(native_llm.gemini_error(429, "X", "m", []).body)) is None
    assert gemini.retry_delay("not json") is None


async def test_a_refused_gemini_key_is_permanent_and_never_shown(
    native: native_llm.NativeLLM,
) -> None:
    key = "AIza-wrong-0123456789-never-print-me"
    async with aclosing(executor(settings("gemini", native.base_url, key))) as running:
        error = await executor_failure(running, request(), secret=key)
    assert type(error) is PermanentError and "API key not valid" in error.message


async def test_gemini_is_asked_for_its_dialect_and_every_answer_checked_against_the_whole_schema(
    native: native_llm.NativeLLM,
) -> None:
    """Gemini's dialect has no ``additionalProperties``: an answer with an extra field gets
    through Gemini, not through the check, and is asked for again."""
    native.script(
        native_llm.gemini_text('{"city": "Brest", "rain": true, "wind": "strong"}'),
        native_llm.gemini_text('{"city": "Brest", "rain": true}'),
    )
    async with aclosing(executor(settings("gemini", native.base_url, native.key))) as running:
        result = await running.execute(request(output_schema=SCHEMA))
    assert result.data == {"city": "Brest", "rain": True}
    assert result.usage == {"prompt_tokens": 18, "completion_tokens": 8, "total_tokens": 26}
    config = native.requests[0].json["generationConfig"]
    assert config == {
        "responseMimeType": "application/json",
        "responseSchema": {
            "type": "OBJECT", "title": "Weather report",
            "properties": {"city": {"type": "STRING"}, "rain": {"type": "BOOLEAN"}},
            "propertyOrdering": ["city", "rain"], "required": ["city", "rain"],
        },
    }  # fmt: skip
    repair = native.requests[1].json["contents"][-1]["parts"][0]["text"]
    assert "Additional properties are not allowed ('wind' was unexpected)" in repair


def test_the_gemini_dialect_keeps_what_it_can_and_says_what_it_drops() -> None:
    schema = {
        "type": "object",
        "$defs": {"level": {"type": "string", "enum": ["low", "high"]}},
        "properties": {
            "level": {"$ref": "#/$defs/level"},
            "note": {"type": ["string", "null"], "maxLength": 80},
            "count": {"type": "integer", "exclusiveMinimum": 0, "format": "int32"},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "kind": {"const": "report"},
        },
        "additionalProperties": False,
    }
    converted, dropped = gemini.response_schema(schema)
    assert converted == {
        "type": "OBJECT",
        "properties": {
            "level": {"type": "STRING", "enum": ["low", "high"]},
            "note": {"type": "STRING", "nullable": True, "maxLength": 80},
            "count": {"type": "INTEGER", "format": "int32"},
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
            "kind": {"enum": ["report"]},
        },
        "propertyOrdering": ["level", "note", "count", "tags", "kind"],
    }
    assert dropped == ["additionalProperties", "exclusiveMinimum", "uniqueItems"]
    # A shape the dialect cannot say: JSON is asked for, the schema given in words.
    assert gemini.response_schema({"type": "object", "additionalProperties": True}) == (None, [])
    recursive = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    assert gemini.response_schema(recursive) == (None, [])


async def test_a_gemini_agent_run_calls_our_tool_through_function_calling(
    native: native_llm.NativeLLM,
) -> None:
    tides = _Tides()
    native.script(
        native_llm.gemini_call("tides__today", {"harbour": "Brest"}, signature="c2lnbmF0dXJl"),
        native_llm.gemini_text("High tide at 14:02."),
    )
    provider = settings("gemini", native.base_url, native.key)
    async with aclosing(executor(provider, _Tools(tides))) as running:
        result = await running.execute(request(params={"tools": ["tides.today"]}, timeout=20))
    assert result.output == "High tide at 14:02." and tides.calls == [{"harbour": "Brest"}]
    first, second = (r.json for r in native.requests)
    assert first["tools"] == [{"functionDeclarations": [{
        "name": "tides__today", "description": _Tides.description,
        "parameters": {"type": "OBJECT", "properties": {"harbour": {"type": "STRING"}},
                       "propertyOrdering": ["harbour"], "required": ["harbour"]}}]}]  # fmt: skip
    assert second["contents"][1:] == [
        {"role": "model", "parts": [{"functionCall": {"name": "tides__today",
                                                      "args": {"harbour": "Brest"}},
                                     "thoughtSignature": "c2lnbmF0dXJl"}]},
        {"role": "user", "parts": [{"functionResponse": {
            "name": "tides__today", "response": {"content": "high tide at Brest: 14:02"}}}]},
    ]  # fmt: skip


async def test_doctor_asks_gemini_for_its_models_with_the_key(
    native: native_llm.NativeLLM,
) -> None:
    ok = await probe.probe(
        settings("gemini", native.base_url, native.key), netguard.NO_WEBHOOK_ALLOW
    )
    assert ok.ok and "/v1beta/models answered 200" in ok.message and "1 models" in ok.message
    assert native.requests[-1].headers["x-goog-api-key"] == native.key
    wrong = await probe.probe(settings("gemini", native.base_url, "AIza-wrong"),
                              netguard.NO_WEBHOOK_ALLOW)  # fmt: skip
    assert wrong.ok is False and "API key not valid" in wrong.message and wrong.key_refused
    # doctor's fix names the key's variable, not the base_url, for Gemini's 400 too
    wrong_key = settings("gemini", native.base_url, "AIza-wrong")
    (check,) = await probes.providers({"gemini": wrong_key}, netguard.NO_WEBHOOK_ALLOW)
    assert check.status == "fail" and check.fix is not None and "TEST_KEY" in check.fix
    assert "AIza-wrong" not in wrong.message


# --- configuration and save-time checks ----------------------------------------------------------


def test_the_kinds_are_configured_like_any_provider_and_the_key_only_through_a_variable() -> None:
    env = {
        "PROMPTSCHED_PROVIDERS": "claude,gem",
        "PROMPTSCHED_PROVIDER_CLAUDE_KIND": "anthropic",
        "PROMPTSCHED_PROVIDER_CLAUDE_API_KEY_ENV": "ANTHROPIC_API_KEY",
        "PROMPTSCHED_PROVIDER_CLAUDE_API_VERSION": "2023-06-01",
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "PROMPTSCHED_PROVIDER_GEM_KIND": "gemini",
        "PROMPTSCHED_PROVIDER_GEM_API_KEY_ENV": "GEMINI_API_KEY",
        "GEMINI_API_KEY": "AIza-test",
    }
    found = parse_providers(env)
    assert found["claude"].base_url == "https://api.anthropic.com"
    assert found["gem"].base_url == "https://generativelanguage.googleapis.com"
    assert found["claude"].api_key == Secret("sk-ant-test") and found["gem"].api_version is None
    with pytest.raises(ValidationError, match="only an anthropic provider has an API version"):
        parse_providers({**env, "PROMPTSCHED_PROVIDER_GEM_API_VERSION": "v1"})


def _schedule(provider: str, params: dict[str, Any], fallback: list[str] | None = None) -> Any:
    raw = {"name": "n", "cron": "0 9 * * *", "prompt": "p", "provider": provider,
           "params": params, "fallback": fallback}  # fmt: skip
    kinds = {"claude": "anthropic", "gem": "gemini", "gpt": "openai", "echo": "echo"}
    return inputs.validate(raw, providers=kinds, provider_kinds=kinds)


def test_params_are_checked_at_save_time_for_the_provider_and_its_fallbacks() -> None:
    _schedule("claude", {"max_tokens": "500", "temperature": "0.5", "top_k": 5, "stop": "END"})
    _schedule("gem", {"top_k": 5, "seed": 3, "max_tokens": 100, "tools": ["http_get"]})
    with pytest.raises(ValidationError, match=r"params\.temperature: must be between 0 and 1"):
        _schedule("claude", {"temperature": 1.5})
    with pytest.raises(ValidationError, match=r"params\.response_format: unknown parameter"):
        _schedule("gem", {"response_format": "json_object"})
    # An attempt may go to the fallback: its kind must take the params too.
    _schedule("claude", {"temperature": 0.5, "max_tokens": 300}, fallback=["gpt"])
    with pytest.raises(ValidationError, match=r"params\.top_k: .*fallback provider 'gpt'"):
        _schedule("claude", {"top_k": 5}, fallback=["gpt"])
