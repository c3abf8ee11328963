"""A provider's connections: its pooled aiohttp session (keep-alive shorter than the servers'),
a second session that always connects anew, and what one request met on the wire (a reused
connection or a new one, an answer begun or not).

That is what tells the keep-alive race apart: a server closes an idle connection at the moment
our next request goes out on it, and the request ends before any byte of an answer. Such a
request is sent once more on a new connection (``http_client``), as Go's net/http and the
OpenAI SDK do; a new connection that ends the same way is the server refusing us, and is not.
"""

from __future__ import annotations

import errno
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

# Servers drop idle connections after their own keep-alive: uvicorn (the LiteLLM proxy) and
# Node after 5 s, aiohttp clients keep theirs 15 s. Dropping ours first narrows the window in
# which a request goes out on a connection the server is closing; the one resend closes it.
KEEPALIVE_SECONDS = 4.0
_CLOSED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


@dataclass(slots=True)
class Wire:
    """What one request met: whether it went out on a pooled connection (the provider's
    connector says, ``sending``) and whether the response's status line and headers arrived
    (``http_client`` says)."""

    reused: bool = False  # it went out on a pooled connection
    answered: bool = False  # the response's status line and headers arrived


_SENDING: ContextVar[Wire | None] = ContextVar("promptsched_http_wire", default=None)


@contextmanager
def sending() -> Iterator[Wire]:
    """The ``Wire`` of the request this task sends inside the block (one at a time)."""
    wire = Wire()
    token = _SENDING.set(wire)
    try:
        yield wire
    finally:
        _SENDING.reset(token)


class _Pool(aiohttp.TCPConnector):
    """The pooled connector: it knows the connections it has handed out, so it tells the
    request being sent (``sending``) whether it got one of them again. aiohttp's trace signals
    say the same, at about 20 µs a request (every signal of every request is sent once any
    trace is configured): a twentieth of a slow call's whole cost at thousands in flight."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's own signature)
    ) -> Connection:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is not None:
            reused = protocol in self._handed
            self._handed.add(protocol)
            if (wire := _SENDING.get()) is not None:
                wire.reused = reused
        return connection


def closed_unanswered(exc: BaseException, wire: Wire) -> bool:
    """Whether ``exc`` ended a request that went out on a REUSED connection, which ended
    before any byte of an answer: the server closed it (end of stream, reset, broken pipe).
    A request whose answer began (headers read, or a partial status line, which aiohttp hands
    over as the ``message`` of ``ServerDisconnectedError``) is never one, whatever its status.
    """
    if not wire.reused or wire.answered:
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return isinstance(exc.message, str)  # not a partly read response
    if isinstance(exc, aiohttp.ClientConnectorError):  # connecting: only a new connection does
        return False
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return True
    if not isinstance(exc, aiohttp.ClientOSError):
        return False
    # A write to a connection already closing arrives as "Can not write request body" with no
    # errno, caused by aiohttp's ClientConnectionResetError.
    return exc.errno in _CLOSED_ERRNOS or isinstance(
        exc.__cause__, ConnectionResetError | BrokenPipeError
    )


def open_session(
    *,
    connect_timeout: float,
    max_concurrency: int,
    resolver: AbstractResolver | None = None,
    fresh: bool = False,
) -> aiohttp.ClientSession:
    """One session per provider. The whole-request timeout is applied per call by
    ``http_client``; the pool is larger than the provider's limit so the ``Limiter``, not the
    pool, is what makes callers wait. With a ``resolver`` (the address guard's), every
    connection goes to an address it returned: no DNS cache outlives its check. A ``fresh``
    session never reuses a connection (the resend of ``closed_unanswered`` goes there)."""
    limit = max(100, max_concurrency)
    guarded = resolver is not None
    if fresh:
        connector = aiohttp.TCPConnector(
            limit=limit, force_close=True, resolver=resolver, use_dns_cache=not guarded
        )
    else:
        connector = _Pool(
            limit=limit, keepalive_timeout=KEEPALIVE_SECONDS, resolver=resolver,
            use_dns_cache=not guarded,
        )  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


class LazySession:
    """One provider's sessions, opened on first use (and again if closed), closed by
    ``aclose``: the pooled one (``get``) and the one that always connects anew (``fresh``).
    ``resolver`` builds the resolver of each new session (the address guard's), so a resend
    resolves through the same guard as the request it repeats."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        max_concurrency: int,
        resolver: Callable[[], AbstractResolver] | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._max_concurrency = max_concurrency
        self._resolver = resolver
        self._pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    def _open(self, *, fresh: bool) -> aiohttp.ClientSession:
        return open_session(
            connect_timeout=self._connect_timeout,
            max_concurrency=self._max_concurrency,
            resolver=self._resolver() if self._resolver is not None else None,
            fresh=fresh,
        )

    def get(self) -> aiohttp.ClientSession:
        if self._pooled is None or self._pooled.closed:
            self._pooled = self._open(fresh=False)
        return self._pooled

    def fresh(self) -> aiohttp.ClientSession:
        if self._fresh is None or self._fresh.closed:
            self._fresh = self._open(fresh=True)
        return self._fresh

    async def aclose(self) -> None:
        sessions = (self._pooled, self._fresh)
        self._pooled = self._fresh = None
        for session in sessions:
            if session is not None:
                await session.close()
