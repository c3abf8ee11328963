"""A scriptable OpenAI-compatible (and webhook) HTTP server on 127.0.0.1 for executor tests.

Each POST takes the next scripted behaviour (else the default) and is recorded with its headers
and JSON body; the server counts requests in flight (and the maximum seen) and connections the
client dropped. Tests wait on these through ``wait_until``, never by sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import anyio
from aiohttp import web

from tests.fakes import serve

Kind = Literal[
    "ok", "slow", "hang", "status", "malformed", "drop", "gather", "echo_auth", "tool_calls"
]
_EMPTY: Mapping[str, str] = MappingProxyType({})
DEFAULT_USAGE: Mapping[str, int] = MappingProxyType(
    {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
)


@dataclass(frozen=True)
class Behaviour:
    kind: Kind
    content: str = "hello from the fake"
    usage: Mapping[str, int] = field(default_factory=lambda: DEFAULT_USAGE)
    delay: float = 0.0
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    body: str | None = None
    group: int = 0
    calls: tuple[tuple[str, str], ...] = ()  # (function name, arguments JSON) per tool call
    gate: asyncio.Event | None = None  # answer only once the test sets it
    raw: bytes | None = None  # answer these bytes as they are (after any wait of its kind)


def ok(
    content: str = "hello from the fake",
    usage: Mapping[str, int] = DEFAULT_USAGE,
    headers: Mapping[str, str] = _EMPTY,
) -> Behaviour:
    """200 with a chat completion (on ``/chat/completions``) or ``{"output": ...}`` elsewhere,
    with ``headers`` (a provider's rate-limit headers, say)."""
    return Behaviour("ok", content=content, usage=usage, headers=headers)


def tool_calls(
    *calls: tuple[str, Mapping[str, Any] | str], usage: Mapping[str, int] = DEFAULT_USAGE
) -> Behaviour:
    """200 with an assistant message that asks for these tool calls (``content`` null,
    ``finish_reason`` ``tool_calls``), as the OpenAI tools protocol does."""
    encoded = tuple(
        (name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls
    )
    return Behaviour("tool_calls", usage=usage, calls=encoded)


def reply(body: str, *, status: int = 200, content_type: str = "application/json") -> Behaviour:
    """Exactly this body."""
    return Behaviour("status", status=status, body=body, headers={"Content-Type": content_type})


def raw(body: bytes, content_type: str = "application/json", *, group: int = 0) -> Behaviour:
    """200 with exactly these bytes, which need not be valid UTF-8 nor valid JSON; with
    ``group``, held as ``gather`` holds its requests, so they are answered together."""
    headers = {"Content-Type": content_type}
    return Behaviour("gather" if group else "ok", raw=body, headers=headers, group=group)


def slow(delay: float, content: str = "slow but fine") -> Behaviour:
    return Behaviour("slow", content=content, delay=delay)


def gated(gate: asyncio.Event, then: Behaviour) -> Behaviour:
    """``then``, answered only once the test sets ``gate``."""
    return dataclasses.replace(then, gate=gate)


def hang() -> Behaviour:
    """Never answer (until the server shuts down)."""
    return Behaviour("hang")


def status(code: int, body: str = "", headers: Mapping[str, str] = _EMPTY) -> Behaviour:
    return Behaviour("status", status=code, body=body, headers=headers)


def rate_limited(retry_after: str, headers: Mapping[str, str] = _EMPTY) -> Behaviour:
    body = '{"error": {"message": "Rate limit reached", "type": "requests"}}'
    return status(429, body, {"Retry-After": retry_after, **headers})


def malformed() -> Behaviour:
    """200, ``application/json``, but not JSON."""
    return Behaviour("malformed")


def drop_mid_body() -> Behaviour:
    """Promise a body, send part of it, then close the connection."""
    return Behaviour("drop")


def gather(group: int, content: str = "gathered") -> Behaviour:
    """Hold each request until ``group`` requests have arrived (or 5 s passed), then answer all
    of them: requests overlap for sure, so a broken concurrency limit shows."""
    return Behaviour("gather", content=content, group=group)


def echo_auth() -> Behaviour:
    """A 401 whose body echoes the Authorization header, as some servers do."""
    return Behaviour("echo_auth", status=401)


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: Mapping[str, str]
    body: str
    json: Any
    at: float = field(default_factory=time.monotonic)  # when it arrived


@dataclass
class FakeOpenAI:
    """State of one running fake server; see ``start_fake_openai``."""

    default: Behaviour = field(default_factory=ok)
    # the answer by request, when no scripted behaviour is queued (before the default)
    route: Callable[[RecordedRequest], Behaviour | None] | None = None
    base_url: str = ""
    requests: list[RecordedRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    disconnects: int = 0
    _queue: deque[Behaviour] = field(default_factory=deque)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _group: asyncio.Event = field(default_factory=asyncio.Event)
    _group_size: int = 0

    @property
    def webhook_url(self) -> str:
        return self.base_url.removesuffix("/v1") + "/hook"

    def script(self, *behaviours: Behaviour) -> None:
        """Answer the next requests with these behaviours, in order, then the default."""
        self._queue.extend(behaviours)

    async def wait_until(self, predicate: Callable[[FakeOpenAI], bool]) -> None:
        """Wait until ``predicate(self)`` holds; it is re-checked on every server event."""
        while not predicate(self):
            changed = self._changed
            await changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = (await request.read()).decode()
            self.requests.append(
                RecordedRequest(request.path, dict(request.headers), body, _json_or_none(body))
            )
            self._notify()
            routed = self.route(self.requests[-1]) if self.route is not None else None
            behaviour = self._queue.popleft() if self._queue else routed or self.default
            return await self._respond(request, behaviour)
        except asyncio.CancelledError:
            # handler_cancellation: the client closed the connection (or the server stops).
            self.disconnects += 1
            raise
        finally:
            self.in_flight -= 1
            self._notify()

    async def _respond(self, request: web.Request, behaviour: Behaviour) -> web.StreamResponse:
        if behaviour.gate is not None:
            await behaviour.gate.wait()
        if behaviour.kind == "slow":
            await anyio.sleep(behaviour.delay)
        elif behaviour.kind == "hang":
            await self._closing.wait()
            return web.Response(status=503, text="shutting down")
        elif behaviour.kind == "gather":
            await self._gather(behaviour.group)
        elif behaviour.kind == "status":
            return web.Response(
                status=behaviour.status, text=behaviour.body or "", headers=behaviour.headers
            )
        elif behaviour.kind == "malformed":
            return web.Response(text='{"choices": [{"mess', content_type="application/json")
        elif behaviour.kind == "drop":
            return await _drop_mid_body(request)
        elif behaviour.kind == "echo_auth":
            key = request.headers.get("Authorization", "")
            error = {"error": {"message": f"Incorrect API key provided: {key}"}}
            return web.json_response(error, status=401)
        if behaviour.raw is not None:
            return web.Response(body=behaviour.raw, headers=behaviour.headers)
        return web.json_response(
            _ok_body(request.path, behaviour, self.requests[-1].json), headers=behaviour.headers
        )

    async def _gather(self, group: int) -> None:
        released = self._group
        self._group_size += 1
        if self._group_size >= group:
            self._group, self._group_size = asyncio.Event(), 0
            # Let every other task (clients included) run until blocked first, so a request
            # beyond the group, if a client sent one, reaches us while the group is still held.
            await anyio.wait_all_tasks_blocked()
            released.set()
        with anyio.move_on_after(5.0):  # a safety net only: full groups release at once
            await released.wait()


def _json_or_none(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _ok_body(path: str, behaviour: Behaviour, request_json: Any) -> dict[str, Any]:
    if not path.endswith("/chat/completions"):
        return {"output": behaviour.content, "usage": dict(behaviour.usage)}
    model = request_json.get("model") if isinstance(request_json, dict) else None
    message: dict[str, Any] = {"role": "assistant", "content": behaviour.content}
    finish_reason = "stop"
    if behaviour.kind == "tool_calls":
        message["content"] = None
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(behaviour.calls, 1)
        ]
        finish_reason = "tool_calls"
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
            }
        ],
        "usage": dict(behaviour.usage),
    }


async def _drop_mid_body(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = 4096
    await response.prepare(request)
    await response.write(b'{"choices": [{"message": {"content": "partial')
    assert request.transport is not None
    request.transport.close()
    return response


@asynccontextmanager
async def start_fake_openai(default: Behaviour | None = None) -> AsyncIterator[FakeOpenAI]:
    """Run the fake on 127.0.0.1 (a free port); ``base_url`` ends in ``/v1``."""
    fake = FakeOpenAI(default=default or ok())
    app = web.Application()
    app.router.add_post("/{tail:.*}", fake.handle)
    async with serve(
        app, release=fake._closing, handler_cancellation=True, shutdown_timeout=2.0
    ) as base_url:
        fake.base_url = f"{base_url}/v1"
        yield fake
