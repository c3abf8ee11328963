"""A scriptable server on 127.0.0.1 speaking Anthropic's Messages API and Gemini's
generateContent, for only what the LiteLLM proxy cannot produce (tests/litellm_support.py
serves the plain answers, key refusals and key limits): Anthropic's 529 "overloaded" and its
rate-limit headers, Gemini's ``RetryInfo``, a forced tool-use answer, tool calls, cache usage
and Gemini's model list.

Bodies and headers are the providers' documented ones: Anthropic's errors
(https://docs.anthropic.com/en/api/errors: ``{"type": "error", "error": {"type": ...,
"message": ...}}``, 529 ``overloaded_error``), rate limits (``retry-after`` and
``anthropic-ratelimit-<limit>-remaining``/``-reset``, an RFC 3339 instant) and Messages
replies; Google's errors (https://ai.google.dev/gemini-api/docs/troubleshooting:
``{"error": {"code", "message", "status", "details"}}``, 429 ``RESOURCE_EXHAUSTED`` with a
``google.rpc.RetryInfo`` detail) and ``GenerateContentResponse``.

Each request takes the next scripted answer (else a text answer in the endpoint's shape) and
is recorded with its path, headers and JSON body. A request whose key is not ``key`` is
refused as each provider refuses it (Anthropic 401 ``authentication_error``, Gemini 400
``API_KEY_INVALID``).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import serve

KEY = "sk-native-0123456789-never-print-me"


@dataclass(frozen=True)
class Answer:
    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: Mapping[str, str]
    json: Any
    at: float = field(default_factory=time.monotonic)


# --- Anthropic ---------------------------------------------------------------------------------


def anthropic_message(
    content: list[dict[str, Any]], usage: Mapping[str, int], stop_reason: str = "end_turn"
) -> Answer:
    return Answer(200, {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": content, "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": dict(usage) or {"input_tokens": 12, "output_tokens": 6},
    })  # fmt: skip


def anthropic_text(*texts: str, **usage: int) -> Answer:
    return anthropic_message([{"type": "text", "text": text} for text in texts], usage)


def anthropic_tool_use(name: str, tool_input: Mapping[str, Any], **usage: int) -> Answer:
    block = {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": name,
             "input": dict(tool_input)}  # fmt: skip
    return anthropic_message([block], usage, stop_reason="tool_use")


def anthropic_error(
    status: int, kind: str, message: str, headers: Mapping[str, str] | None = None
) -> Answer:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return Answer(status, body, dict(headers or {}))


def anthropic_overloaded() -> Answer:
    return anthropic_error(529, "overloaded_error", "Overloaded")


def anthropic_rate_limited(retry_after: str, reset: str) -> Answer:
    """429 as Anthropic sends it: ``retry-after`` and the exhausted limit's headers."""
    return anthropic_error(
        429, "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests per "
        "minute.",
        {"retry-after": retry_after, "anthropic-ratelimit-requests-limit": "50",
         "anthropic-ratelimit-requests-remaining": "0",
         "anthropic-ratelimit-requests-reset": reset},
    )  # fmt: skip


# --- Gemini ------------------------------------------------------------------------------------


def gemini_parts(
    parts: list[dict[str, Any]], usage: Mapping[str, int], finish: str = "STOP"
) -> Answer:
    return Answer(200, {
        "candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": finish,
                        "index": 0}],
        "usageMetadata": dict(usage) or {"promptTokenCount": 9, "candidatesTokenCount": 4,
                                   "totalTokenCount": 13},
        "modelVersion": "gemini-2.5-flash", "responseId": "fake-response",
    })  # fmt: skip


def gemini_text(*texts: str, **usage: int) -> Answer:
    return gemini_parts([{"text": text} for text in texts], usage)


def gemini_call(name: str, args: Mapping[str, Any], signature: str | None = None) -> Answer:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": dict(args)}}
    if signature is not None:
        part["thoughtSignature"] = signature
    return gemini_parts([part], {})


def gemini_error(
    status: int, code: str, message: str, details: list[dict[str, Any]] | None = None
) -> Answer:
    error: dict[str, Any] = {"code": status, "message": message, "status": code}
    if details is not None:
        error["details"] = details
    return Answer(status, {"error": error})


def gemini_exhausted(delay: str) -> Answer:
    """429 as the Gemini API sends it for a quota, its wait in a ``RetryInfo`` detail."""
    return gemini_error(
        429, "RESOURCE_EXHAUSTED",
        "You exceeded your current quota, please check your plan and billing details.",
        [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
          "violations": [{"quotaMetric": "generativelanguage.googleapis.com/"
                                         "generate_content_free_tier_requests",
                          "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},
         {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}],
    )  # fmt: skip


@dataclass
class NativeLLM:
    """One running server; ``base_url`` is its root (the providers' base_url)."""

    key: str = KEY
    base_url: str = ""
    requests: list[Recorded] = field(default_factory=list)
    _queue: deque[Answer] = field(default_factory=deque)

    def script(self, *answers: Answer) -> None:
        self._queue.extend(answers)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        self.requests.append(Recorded(request.path, dict(request.headers), data))
        gemini = request.path.startswith("/v1beta/")
        given = request.headers.get("x-goog-api-key" if gemini else "x-api-key")
        if given != self.key:
            refused = (
                gemini_error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid "
                             "API key.", [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                           "reason": "API_KEY_INVALID"}])
                if gemini else anthropic_error(401, "authentication_error", "invalid x-api-key")
            )  # fmt: skip
            return web.json_response(refused.body, status=refused.status)
        if request.method == "GET":
            models = [{"name": "models/gemini-2.5-flash"}] if gemini else None
            listed = {"models": models} if gemini else {"data": [{"id": "claude-sonnet-4-5"}]}
            return web.json_response(listed)
        answer = self._queue.popleft() if self._queue else None
        if answer is None:
            answer = gemini_text("hello from gemini") if gemini else anthropic_text("hello")
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)


@asynccontextmanager
async def start_native_llm() -> AsyncIterator[NativeLLM]:
    server = NativeLLM()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    async with serve(app) as base_url:
        server.base_url = base_url
        yield server
