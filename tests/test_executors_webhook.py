"""The webhook executor against a real HTTP server on loopback: payload, idempotency key,
output extraction, failure classification, secrecy and cancellation."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import anyio
import pytest

from promptsched import netguard
from promptsched.errors import ExecutorError, PermanentError, RetryableError, Throttled
from promptsched.executors import webhook_provider
from promptsched.executors.base import ExecutionRequest
from promptsched.executors.settings import ProviderSettings
from promptsched.secret import Secret
from tests.fakes import openai_server as fake_server
from tests.helpers import executor_failure

KEY = "whsec-do-not-print-0123456789"
# The fake receiver listens on loopback, which the address guard refuses unless listed.
LOOPBACK = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)


def make_settings(url: str, **overrides: Any) -> ProviderSettings:
    values: dict[str, Any] = {
        "name": "hook",
        "kind": "webhook",
        "base_url": url,
        "api_key": Secret(KEY),
        "api_key_env": "HOOK_KEY",
        "request_timeout": timedelta(seconds=10),
        "headers": MappingProxyType({"X-Team": "data"}),
        **overrides,
    }
    return ProviderSettings(**values)


def make_request(**overrides: Any) -> ExecutionRequest:
    values: dict[str, Any] = {
        "run_id": 900,
        "schedule_id": 12,
        "schedule_name": "weekly report",
        "attempt_id": uuid.UUID(int=5),
        "attempt": 1,
        "slot": datetime(2024, 3, 31, 1, 30, tzinfo=UTC),
        "timezone": "Europe/Berlin",
        "prompt": "Write the report",
        "model": "m-1",
        "params": {"tone": "dry"},
        **overrides,
    }
    return ExecutionRequest(**values)


@pytest.fixture
async def executor(fake: fake_server.FakeOpenAI) -> AsyncIterator[webhook_provider.WebhookExecutor]:
    async with aclosing(
        webhook_provider.WebhookExecutor(make_settings(fake.webhook_url), allow=LOOPBACK)
    ) as executor:
        yield executor


async def fail_with(executor: webhook_provider.WebhookExecutor, **overrides: Any) -> ExecutorError:
    return await executor_failure(executor, make_request(**overrides), secret=KEY)


async def test_posts_the_prompt_and_context_as_json(
    fake: fake_server.FakeOpenAI, executor: webhook_provider.WebhookExecutor
) -> None:
    result = await executor.execute(make_request())

    assert result.output == "hello from the fake"
    assert result.usage == dict(fake_server.DEFAULT_USAGE)
    [sent] = fake.requests
    assert sent.path == "/hook"
    assert sent.json == {
        "run_id": 900,
        "schedule_id": 12,
        "schedule_name": "weekly report",
        "slot": "2024-03-31T01:30:00+00:00",
        "timezone": "Europe/Berlin",
        "attempt": 1,
        "attempt_id": str(uuid.UUID(int=5)),
        "prompt": "Write the report",
        "model": "m-1",
        "params": {"tone": "dry"},
        "output_schema": None,
        "followup": None,
    }
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert sent.headers["X-Team"] == "data"


async def test_idempotency_key_is_stable_across_attempts_of_a_run(
    fake: fake_server.FakeOpenAI, executor: webhook_provider.WebhookExecutor
) -> None:
    fake.script(fake_server.status(503))
    await fail_with(executor, attempt=1)
    await executor.execute(make_request(attempt=2, attempt_id=uuid.uuid4()))
    await executor.execute(make_request(run_id=901))

    keys = [request.headers["Idempotency-Key"] for request in fake.requests]
    assert keys == ["promptsched-run-900", "promptsched-run-900", "promptsched-run-901"]


@pytest.mark.parametrize(
    ("body", "content_type", "output", "usage"),
    [
        ("plain words", "text/plain", "plain words", None),
        ('{"output": "from json", "usage": {"tokens": 3}}', "application/json", "from json", 3),
        ('{"result": 1}', "application/json", '{"result": 1}', None),
        ("[1, 2]", "application/json", "[1, 2]", None),
        ("", "text/plain", "", None),
    ],
)
async def test_output_is_the_body_or_its_output_field(
    fake: fake_server.FakeOpenAI,
    executor: webhook_provider.WebhookExecutor,
    body: str,
    content_type: str,
    output: str,
    usage: int | None,
) -> None:
    fake.script(fake_server.reply(body, content_type=content_type))
    result = await executor.execute(make_request())

    assert result.output == output
    assert result.usage == (None if usage is None else {"tokens": usage})


async def test_non_string_output_field_is_an_invalid_response(
    fake: fake_server.FakeOpenAI, executor: webhook_provider.WebhookExecutor
) -> None:
    fake.script(fake_server.reply('{"output": {"nested": true}}'))
    error = await fail_with(executor)

    assert type(error) is PermanentError
    assert error.message == 'hook: invalid response: "output" must be a string'


@pytest.mark.parametrize(
    ("behaviour", "kind", "text"),
    [
        (fake_server.status(500, "boom"), RetryableError, "hook: HTTP 500 Internal Server Error"),
        (
            fake_server.rate_limited("4"),
            Throttled,  # "not now": waits as asked, spends no attempt (docs/providers.md)
            "hook: HTTP 429 Too Many Requests (retry after 4s): Rate limit reached",
        ),
        (fake_server.status(422, "bad shape"), PermanentError, "hook: HTTP 422 Unprocessable"),
        (fake_server.drop_mid_body(), RetryableError, "hook: connection lost"),
        (fake_server.echo_auth(), PermanentError, "hook: HTTP 401 Unauthorized"),
    ],
)
async def test_failures_are_classified_like_openai(
    fake: fake_server.FakeOpenAI,
    executor: webhook_provider.WebhookExecutor,
    behaviour: fake_server.Behaviour,
    kind: type[ExecutorError],
    text: str,
) -> None:
    fake.script(behaviour)
    error = await fail_with(executor)

    assert type(error) is kind
    assert error.message.startswith(text)


async def test_timeout_is_retryable(fake: fake_server.FakeOpenAI) -> None:
    fake.script(fake_server.hang())
    executor = webhook_provider.WebhookExecutor(
        make_settings(fake.webhook_url, request_timeout=timedelta(milliseconds=300)),
        allow=LOOPBACK,
    )
    try:
        error = await fail_with(executor)
    finally:
        await executor.aclose()

    assert type(error) is RetryableError
    assert error.message == "hook: request timed out after 300ms"


async def test_params_that_are_not_json_are_permanent(
    fake: fake_server.FakeOpenAI, executor: webhook_provider.WebhookExecutor
) -> None:
    error = await fail_with(executor, params={"when": datetime(2024, 1, 1, tzinfo=UTC)})

    assert type(error) is PermanentError
    assert error.message.startswith("hook: request is not JSON-serializable")
    assert fake.requests == []


async def test_cancelling_an_attempt_aborts_the_request_promptly(
    fake: fake_server.FakeOpenAI, executor: webhook_provider.WebhookExecutor
) -> None:
    fake.script(fake_server.hang())
    started = time.monotonic()
    with anyio.move_on_after(10) as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(executor.execute, make_request())
            with anyio.fail_after(5):
                await fake.wait_until(lambda server: server.in_flight == 1)
            group.cancel_scope.cancel()

    assert not scope.cancelled_caught
    assert time.monotonic() - started < 2
    with anyio.fail_after(5):
        await fake.wait_until(lambda server: server.disconnects == 1)
