"""The openai executor against a real HTTP server on loopback: success, every failure class,
Retry-After, secrecy of the API key, and prompt cancellation; plus the pure classifiers."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import pytest

from promptsched.errors import ExecutorError, PermanentError, RetryableError, ValidationError
from promptsched.executors import http_client, openai
from promptsched.executors.base import ExecutionRequest
from promptsched.executors.settings import ProviderSettings
from promptsched.secret import Secret
from tests.fakes import openai_server as fake_server
from tests.helpers import executor_failure

KEY = "sk-test-0123456789abcdef-never-print-me"


def make_settings(base_url: str, **overrides: Any) -> ProviderSettings:
    values: dict[str, Any] = {
        "name": "openai",
        "kind": "openai",
        "base_url": base_url,
        "api_key": Secret(KEY),
        "api_key_env": "TEST_OPENAI_KEY",
        "default_model": "gpt-default",
        "connect_timeout": timedelta(seconds=2),
        "request_timeout": timedelta(seconds=10),
        **overrides,
    }
    return ProviderSettings(**values)


def make_request(**overrides: Any) -> ExecutionRequest:
    values: dict[str, Any] = {
        "run_id": 41,
        "schedule_id": 7,
        "schedule_name": "morning digest",
        "attempt_id": uuid.uuid4(),
        "attempt": 1,
        "slot": datetime(2024, 3, 1, 9, 0, tzinfo=UTC),
        "timezone": "Europe/Paris",
        "prompt": "Summarise the news",
        **overrides,
    }
    return ExecutionRequest(**values)


@pytest.fixture
async def executor(fake: fake_server.FakeOpenAI) -> AsyncIterator[openai.OpenAIExecutor]:
    async with aclosing(openai.OpenAIExecutor(make_settings(fake.base_url))) as executor:
        yield executor


async def fail_with(executor: openai.OpenAIExecutor, **overrides: Any) -> ExecutorError:
    return await executor_failure(executor, make_request(**overrides), secret=KEY)


# --- success -------------------------------------------------------------------------------


async def test_ok_returns_content_and_usage_and_sends_bearer_key(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.ok("Bonjour", usage={"prompt_tokens": 11, "completion_tokens": 4}))

    result = await executor.execute(make_request())

    assert result.output == "Bonjour"
    assert result.usage == {"prompt_tokens": 11, "completion_tokens": 4}
    [sent] = fake.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert sent.json == {
        "model": "gpt-default",
        "messages": [{"role": "user", "content": "Summarise the news"}],
    }


async def test_system_prompt_model_and_whitelisted_params_are_sent_typed(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    params = {
        "system": "Be brief.",
        "temperature": "0.2",  # CLI --param values arrive as strings
        "max_tokens": "50",
        "seed": 3,
        "stop": ["\n\n"],
        "response_format": "json_object",
    }
    await executor.execute(make_request(model="gpt-special", params=params))

    [sent] = fake.requests
    assert sent.json == {
        "model": "gpt-special",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Summarise the news"},
        ],
        "temperature": 0.2,
        "max_tokens": 50,
        "seed": 3,
        "stop": ["\n\n"],
        "response_format": {"type": "json_object"},
    }


async def test_every_attempt_is_a_fresh_conversation(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.status(500), fake_server.ok("second"))
    await fail_with(executor, attempt=1)
    result = await executor.execute(make_request(attempt=2))

    assert result.output == "second"
    first, second = fake.requests
    assert first.json == second.json  # nothing of attempt 1 leaks into attempt 2
    assert len(second.json["messages"]) == 1


# --- failure classification ----------------------------------------------------------------


async def test_429_with_retry_after_seconds_is_retryable(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.rate_limited("12"))
    error = await fail_with(executor)

    assert isinstance(error, RetryableError) and error.throttled  # a 429 is throttling
    assert error.retry_after == 12.0
    assert error.message == (
        "openai: HTTP 429 Too Many Requests (retry after 12s): Rate limit reached"
    )


async def test_retry_after_http_date_is_measured_from_the_servers_date_header(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    # Years in the past on purpose: our own clock must not matter, only the server's.
    server_now = datetime(2015, 10, 21, 7, 28, tzinfo=UTC)
    retry_at = server_now + timedelta(minutes=2)
    fake.script(
        fake_server.rate_limited(
            format_datetime(retry_at, usegmt=True),
            headers={"Date": format_datetime(server_now, usegmt=True)},
        )
    )
    error = await fail_with(executor)

    assert isinstance(error, RetryableError)
    assert error.retry_after == 120.0
    assert "(retry after 2m)" in error.message


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (500, "openai: HTTP 500 Internal Server Error: upstream exploded"),
        (502, "openai: HTTP 502 Bad Gateway: upstream exploded"),
        (503, "openai: HTTP 503 Service Unavailable: upstream exploded"),
        (408, "openai: HTTP 408 Request Timeout: upstream exploded"),
    ],
)
async def test_5xx_and_408_are_retryable(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor, code: int, text: str
) -> None:
    fake.script(fake_server.status(code, "upstream exploded"))
    error = await fail_with(executor)

    assert isinstance(error, RetryableError)
    assert error.message == text
    assert error.retry_after is None


async def test_400_is_permanent_with_the_providers_message(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    body = '{"error": {"message": "Invalid value for temperature", "type": "invalid_request"}}'
    fake.script(fake_server.status(400, body))
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert error.message == "openai: HTTP 400 Bad Request: Invalid value for temperature"


async def test_404_is_permanent_and_hints_at_base_url_and_model(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.status(404, "no such model"))
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert "HTTP 404 Not Found (check the provider's base_url and the model name)" in str(error)


async def test_redirect_is_not_followed(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.status(307, headers={"Location": "http://elsewhere.invalid/v1"}))
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert "redirect to http://elsewhere.invalid/v1 not followed" in error.message
    assert len(fake.requests) == 1


async def test_malformed_json_is_a_permanent_invalid_response(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.malformed())
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert error.message.startswith("openai: invalid response: body is not JSON")


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ('{"object": "chat.completion"}', "no choices"),
        ('{"choices": []}', "no choices"),
        ('{"choices": [{"index": 0}]}', "choices[0].message is missing"),
        ('{"choices": [{"message": {"content": 5}}]}', "content is not a string"),
        ('{"choices": [{"message": {"tool_calls": []}}]}', "has no text content"),
        ('{"error": {"message": "overloaded"}}', "overloaded"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
async def test_unexpected_json_is_a_permanent_invalid_response(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor, body: str, detail: str
) -> None:
    fake.script(fake_server.reply(body))
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert error.message.startswith("openai: invalid response:")
    assert detail in error.message


async def test_refusal_is_permanent(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    body = '{"choices": [{"message": {"content": null, "refusal": "I cannot help"}}]}'
    fake.script(fake_server.reply(body))
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert error.message == "openai: the model refused: I cannot help"


async def test_connection_dropped_mid_body_is_retryable(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.drop_mid_body())
    error = await fail_with(executor)

    assert isinstance(error, RetryableError)
    assert error.message.startswith("openai: connection lost while reading the response")


async def test_hanging_server_times_out_and_the_connection_is_closed(
    fake: fake_server.FakeOpenAI,
) -> None:
    fake.script(fake_server.hang())
    executor = openai.OpenAIExecutor(
        make_settings(fake.base_url, request_timeout=timedelta(milliseconds=300))
    )
    try:
        started = time.monotonic()
        error = await fail_with(executor)
        elapsed = time.monotonic() - started
    finally:
        await executor.aclose()

    assert isinstance(error, RetryableError)
    assert error.message == "openai: request timed out after 300ms"
    assert 0.3 <= elapsed < 3
    with anyio.fail_after(5):
        await fake.wait_until(lambda server: server.disconnects == 1)


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port that is bound but not listening: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_connection_refused_is_retryable(refused_port: int) -> None:
    executor = openai.OpenAIExecutor(make_settings(f"http://127.0.0.1:{refused_port}/v1"))
    try:
        error = await fail_with(executor)
    finally:
        await executor.aclose()

    assert isinstance(error, RetryableError)
    assert error.message.startswith(f"openai: cannot connect to 127.0.0.1:{refused_port}")


# --- request validation --------------------------------------------------------------------


async def test_missing_model_is_permanent_and_sends_nothing(fake: fake_server.FakeOpenAI) -> None:
    executor = openai.OpenAIExecutor(make_settings(fake.base_url, default_model=None))
    try:
        error = await fail_with(executor)
    finally:
        await executor.aclose()

    assert type(error) is PermanentError
    assert "no model" in error.message
    assert fake.requests == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"temperature": "warm"}, "params.temperature"),
        ({"max_tokens": "1.5"}, "params.max_tokens"),
        ({"temprature": 1}, "params.temprature"),
        ({"stop": [1, 2]}, "params.stop"),
        ({"system": 3}, "params.system"),
        ({"response_format": "{not json"}, "params.response_format"),
    ],
)
async def test_bad_params_are_permanent_and_rejected_at_save_time(
    fake: fake_server.FakeOpenAI,
    executor: openai.OpenAIExecutor,
    params: dict[str, Any],
    field: str,
) -> None:
    with pytest.raises(ValidationError) as caught:
        openai.validate_params(params)
    assert caught.value.field == field

    error = await fail_with(executor, params=params)
    assert type(error) is PermanentError
    assert field in error.message
    assert fake.requests == []


# --- secrecy and cancellation --------------------------------------------------------------


async def test_a_key_echoed_by_the_server_is_redacted(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.echo_auth())
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert error.message.startswith("openai: HTTP 401 Unauthorized (check the provider's API key)")
    assert "Bearer ********" in error.message
    assert KEY not in repr(executor.__dict__)
    assert KEY not in repr(make_settings(fake.base_url))


async def test_cancelling_an_attempt_aborts_the_request_promptly(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    fake.script(fake_server.hang())
    outcomes: list[BaseException] = []

    async def attempt() -> None:
        try:
            await executor.execute(make_request())
        except BaseException as exc:  # record what a fenced attempt sees
            outcomes.append(exc)
            raise

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        group.start_soon(attempt)
        with anyio.fail_after(5):
            await fake.wait_until(lambda server: server.in_flight == 1)
        group.cancel_scope.cancel()
    elapsed = time.monotonic() - started

    assert elapsed < 2  # the request timeout is 10s: only the cancellation can end it early
    assert [type(exc) for exc in outcomes] == [anyio.get_cancelled_exc_class()]
    with anyio.fail_after(5):
        await fake.wait_until(lambda server: server.disconnects == 1)


async def test_the_session_is_reused_and_reopened_after_aclose(
    fake: fake_server.FakeOpenAI, executor: openai.OpenAIExecutor
) -> None:
    await executor.execute(make_request())
    await executor.execute(make_request())
    await executor.aclose()
    result = await executor.execute(make_request())

    assert result.output == "hello from the fake"
    assert len(fake.requests) == 3


# --- pure classifiers ----------------------------------------------------------------------

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("0", 0.0),
        ("12", 12.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        ("Sat, 01 Jun 2024 12:00:30 GMT", 30.0),
        ("Sat, 01 Jun 2024 11:00:00 GMT", 0.0),  # in the past: retry now
        ("soon", None),
        ("-5", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert http_client.parse_retry_after(value, NOW) == expected


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (403, False), (404, False), (409, False), (422, False)]
    + [(408, True), (429, True), (500, True), (502, True), (503, True), (504, True)],
)
def test_classify_status_table(status: int, retryable: bool) -> None:
    error = http_client.classify_status(status, {}, "", provider="p", now=NOW)
    assert error.retryable is retryable
    assert isinstance(error, RetryableError if retryable else PermanentError)
    assert error.message.startswith(f"p: HTTP {status} ")


def test_classify_status_reads_retry_after_case_insensitively() -> None:
    error = http_client.classify_status(503, {"retry-after": "3"}, "busy", provider="p", now=NOW)
    assert error.retry_after == 3.0
    assert error.message == "p: HTTP 503 Service Unavailable (retry after 3s): busy"
    ignored = http_client.classify_status(400, {"Retry-After": "3"}, "", provider="p", now=NOW)
    assert ignored.retry_after is None


def test_body_excerpt_prefers_the_json_error_message_and_truncates() -> None:
    assert http_client.body_excerpt(b'{"error": {"message": "bad  key\\n here"}}') == "bad key here"
    assert http_client.body_excerpt('{"detail": "nope"}') == "nope"
    long = http_client.body_excerpt("x" * 1000)
    assert len(long) == http_client.EXCERPT_CHARS and long.endswith("…")
