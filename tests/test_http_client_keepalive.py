"""The keep-alive race: a request that goes out on a pooled connection as the server closes it
is sent once more on a new connection, and nothing else is. A raw HTTP/1.1 server of our own
plays the server's side deterministically: it reads the request, then closes (or resets) the
connection without a word, or begins an answer and drops it. Then the run-level effect through
the openai executor and a real WorkerPool, and the address guard on the resend."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import asyncpg
import pytest
import structlog.testing

from promptsched import netguard
from promptsched.clock import FrozenClock
from promptsched.errors import RetryableError
from promptsched.executors import http_client, http_pool
from tests.factories import EPOCH, attempt_statuses, run_row
from tests.helpers import wait_until
from tests.test_providers_integration import fake_run, fake_workers

Step = Literal["answer", "close", "reset"] | bytes
Plan = Callable[[int, int], Step]  # (connection, request on it), both from 1 -> what to do

ANSWER = json.dumps(
    {
        "choices": [{"message": {"role": "assistant", "content": "fine"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()
STATUS_LINE_ONLY = b"HTTP/1.1 200 OK\r\n"
HEADERS_ONLY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 40\r\n\r\n"
HEADERS_AND_SOME_BODY = b'HTTP/1.1 200 OK\r\nContent-Length: 90\r\n\r\n{"choices": ['


@dataclass(frozen=True)
class Seen:
    connection: int
    body: bytes


@dataclass
class RawServer:
    """An HTTP/1.1 server on asyncio streams that does what ``plan`` says for the n-th request
    on each connection: answer (200, keep-alive), close without answering (FIN), reset (RST),
    or send some bytes of an answer and close."""

    plan: Plan
    requests: list[Seen] = field(default_factory=list)
    left: list[int] = field(default_factory=list)  # connections the client closed
    base_url: str = ""
    _connections: int = 0
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def _read(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")),
                0,
            )  # fmt: skip
            return await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None  # the client went away

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        connection, count = self._connections, 0
        self._writers.add(writer)
        try:
            while (body := await self._read(reader)) is not None:
                count += 1
                self.requests.append(Seen(connection, body))
                step = self.plan(connection, count)
                if step != "answer":
                    await self._end(writer, step)
                    return
                head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                head += f"Content-Length: {len(ANSWER)}\r\n\r\n"
                writer.write(head.encode() + ANSWER)
                await writer.drain()
            self.left.append(connection)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _end(self, writer: asyncio.StreamWriter, step: Step) -> None:
        if isinstance(step, bytes):
            writer.write(step)
            await writer.drain()
        elif step == "reset":  # linger 0: close sends RST, not FIN
            linger = struct.pack("ii", 1, 0)
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RawServer]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()
            for writer in list(self._writers):
                writer.close()
            await server.wait_closed()

    def seen(self) -> list[tuple[int, Any]]:
        return [(seen.connection, json.loads(seen.body)) for seen in self.requests]


def second_request_unanswered(how: Step) -> Plan:
    """The close race, made certain: every connection's first request is answered, and a
    second request on it meets ``how``."""
    return lambda _connection, count: "answer" if count == 1 else how


def sessions(**overrides: Any) -> http_pool.LazySession:
    return http_pool.LazySession(connect_timeout=2, max_concurrency=4, **overrides)


async def post(session: http_client.Session, url: str, call: int) -> http_client.HttpReply:
    return await http_client.post_json(
        session, f"{url}/v1/chat/completions", {"call": call},
        headers={"Authorization": "Bearer sk-keepalive-secret"}, provider="openai",
        request_timeout=10, connect_timeout=2,
    )  # fmt: skip


@asynccontextmanager
async def serving(plan: Plan) -> AsyncIterator[tuple[RawServer, http_pool.LazySession]]:
    session = sessions()
    async with RawServer(plan).running() as server:
        try:
            yield server, session
        finally:
            await session.aclose()


# --- the resend -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_reused_connection_closed_before_answering_is_sent_again_on_a_new_one(
    how: Step,
) -> None:
    async with serving(second_request_unanswered(how)) as (server, session):
        first = await post(session, server.base_url, 1)
        with structlog.testing.capture_logs() as logs:
            second = await post(session, server.base_url, 2)

    assert (first.status, second.status) == (200, 200)
    assert second.json("openai")["choices"][0]["message"]["content"] == "fine"
    # The second call went out on the first call's connection, met the close, and was sent
    # once more on a new connection.
    assert server.seen() == [(1, {"call": 1}), (1, {"call": 2}), (2, {"call": 2})]
    [logged] = logs
    assert (logged["event"], logged["provider"]) == ("http_resent_on_new_connection", "openai")
    assert "sk-keepalive-secret" not in repr(logs)  # the headers hold the key: never logged


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("close", "openai: server closed the connection before answering"),
        ("reset", "openai: connection error: [Errno 104] Connection reset by peer"),
    ],
)
async def test_a_fresh_connection_closed_before_answering_is_not_sent_again(
    how: Step, message: str
) -> None:
    async with serving(lambda _connection, _count: how) as (server, session):
        with pytest.raises(RetryableError) as caught:
            await post(session, server.base_url, 1)

    assert caught.value.message == message
    assert server.seen() == [(1, {"call": 1})]


async def test_the_resend_is_sent_once_and_its_own_close_is_a_failure() -> None:
    # The first connection answers once then closes; every later one closes at once.
    def plan(connection: int, count: int) -> Step:
        return "answer" if (connection, count) == (1, 1) else "close"

    async with serving(plan) as (server, session):
        await post(session, server.base_url, 1)
        with pytest.raises(RetryableError) as caught:
            await post(session, server.base_url, 2)

    assert caught.value.message == "openai: server closed the connection before answering"
    assert server.seen() == [(1, {"call": 1}), (1, {"call": 2}), (2, {"call": 2})]


@pytest.mark.parametrize(
    ("begun", "message"),
    [
        pytest.param(
            STATUS_LINE_ONLY, "openai: server closed the connection before answering",
            id="status-line",
        ),
        pytest.param(
            HEADERS_ONLY, "openai: connection lost while reading the response", id="headers"
        ),
        pytest.param(
            HEADERS_AND_SOME_BODY, "openai: connection lost while reading the response",
            id="headers-and-some-body",
        ),
    ],
)  # fmt: skip
async def test_an_answer_that_began_is_never_sent_again(begun: bytes, message: str) -> None:
    async with serving(second_request_unanswered(begun)) as (server, session):
        await post(session, server.base_url, 1)
        with pytest.raises(RetryableError) as caught:
            await post(session, server.base_url, 2)

    assert caught.value.message.startswith(message), caught.value.message
    assert server.seen() == [(1, {"call": 1}), (1, {"call": 2})]


async def test_a_plain_session_sends_once() -> None:
    # A probe's one-off aiohttp session has no fresh session to resend on.
    async with RawServer(second_request_unanswered("close")).running() as server:
        async with aiohttp.ClientSession() as session:
            await post(session, server.base_url, 1)
            with pytest.raises(RetryableError):
                await post(session, server.base_url, 2)
    assert server.seen() == [(1, {"call": 1}), (1, {"call": 2})]


async def test_an_idle_pooled_connection_is_closed_after_our_keepalive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert http_pool.KEEPALIVE_SECONDS < 5  # below uvicorn's and Node's keep-alive
    monkeypatch.setattr(http_pool, "KEEPALIVE_SECONDS", 0.1)  # not aiohttp's 15 s
    async with serving(lambda _connection, _count: "answer") as (server, session):
        await post(session, server.base_url, 1)

        async def closed() -> list[int]:
            return server.left

        # We close the idle connection ourselves, long before a server would.
        await wait_until(closed, timeout=5, what="the client to close its idle connection")
    assert server.left == [1]


@pytest.mark.parametrize(
    ("error", "wire", "resent"),
    [
        (aiohttp.ServerDisconnectedError(), http_pool.Wire(reused=True), True),
        (aiohttp.ServerDisconnectedError(), http_pool.Wire(reused=False), False),
        (aiohttp.ServerDisconnectedError(), http_pool.Wire(reused=True, answered=True), False),
        (aiohttp.ClientOSError(errno.ECONNRESET, "reset"), http_pool.Wire(reused=True), True),
        (aiohttp.ClientOSError(errno.EPIPE, "broken pipe"), http_pool.Wire(reused=True), True),
        (aiohttp.ClientOSError(errno.EHOSTUNREACH, "no route"), http_pool.Wire(reused=True),
         False),
        (aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
         http_pool.Wire(reused=True), True),
        (aiohttp.ClientPayloadError("Response payload is not completed"),
         http_pool.Wire(reused=True), False),
        (TimeoutError(), http_pool.Wire(reused=True), False),
    ],
)  # fmt: skip
def test_which_failures_are_the_close_race(
    error: BaseException, wire: http_pool.Wire, resent: bool
) -> None:
    assert http_pool.closed_unanswered(error, wire) is resent


def test_a_write_to_a_closing_connection_is_the_close_race() -> None:
    # How aiohttp reports it: no errno, caused by its ClientConnectionResetError.
    error = aiohttp.ClientOSError(None, "Can not write request body for http://x/")
    error.__cause__ = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    assert http_pool.closed_unanswered(error, http_pool.Wire(reused=True))
    assert not http_pool.closed_unanswered(error, http_pool.Wire(reused=False))


# --- the address guard on the resend -------------------------------------------------------


async def test_the_resend_resolves_through_the_address_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = {"model.internal": "127.0.0.1"}
    lookups: list[str] = []

    async def fake_getaddrinfo(host: str, port: int, **_: Any) -> list[Any]:
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(netguard.anyio, "getaddrinfo", fake_getaddrinfo)
    allow = netguard.Allowlist.parse("127.0.0.1/32", variable="PROMPTSCHED_WEBHOOK_ALLOW")
    session = sessions(resolver=lambda: netguard.GuardedResolver(allow))
    async with RawServer(second_request_unanswered("close")).running() as server:
        url = server.base_url.replace("127.0.0.1", "model.internal")
        try:
            await post(session, url, 1)
            await post(session, url, 2)  # resent on a new connection, looked up and allowed
            await post(session, url, 3)  # a new pooled connection
            # The name now points at a private address (DNS rebinding): the resend's new
            # connection is checked like any other, and refused before it connects.
            answers["model.internal"] = "10.0.0.7"
            with pytest.raises(netguard.AddressRefused) as caught:
                await post(session, url, 4)
        finally:
            await session.aclose()

    assert str(caught.value) == (
        "10.0.0.7 (model.internal resolves to it) is private and not in PROMPTSCHED_WEBHOOK_ALLOW"
    )
    # One lookup per new connection: the first, the resend of 2, the third, the resend of 4.
    assert lookups == ["model.internal"] * 4
    assert server.seen() == [
        (1, {"call": 1}), (1, {"call": 2}), (2, {"call": 2}), (3, {"call": 3}), (3, {"call": 4}),
    ]  # fmt: skip


# --- the run-level effect -------------------------------------------------------------------


async def test_a_run_whose_request_met_the_close_race_succeeds_on_its_first_attempt(
    pool: asyncpg.Pool[Any],
) -> None:
    clock = FrozenClock(EPOCH)
    async with RawServer(second_request_unanswered("close")).running() as server:
        async with fake_workers(pool, clock, f"{server.base_url}/v1", timeout="10s") as workers:
            first = await fake_run(pool, max_attempts=1)
            assert await workers.run_once() == 1
            second = await fake_run(pool, max_attempts=1)  # sent on the first's connection
            assert await workers.run_once() == 1

    for rid in (first, second):
        run = await run_row(pool, rid)
        assert (run["status"], run["attempts"], run["error"]) == ("succeeded", 1, None)
        assert run["output"] == "fine"
        assert await attempt_statuses(pool, rid) == ["succeeded"]
    assert [connection for connection, _ in server.seen()] == [1, 1, 2]
    assert server.requests[1].body == server.requests[2].body  # the same request, resent
