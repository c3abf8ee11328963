"""A provider's connections: its pooled aiohttp session (keep-alive shorter than the servers'),
a second session that always connects anew, and what one request met on the wire (a reused
connection or a new one, an answer begun or not), read from aiohttp's public trace signals.

That is what tells the keep-alive race apart: a server closes an idle connection at the moment
our next request goes out on it, and the request ends before any byte of an answer. Such a
request is sent once more on a new connection (``http_client``), as Go's net/http and the
OpenAI SDK do; a new connection that ends the same way is the server refusing us, and is not.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver

# Servers drop idle connections after their own keep-alive: uvicorn (the LiteLLM proxy) and
# Node after 5 s, aiohttp clients keep theirs 15 s. Dropping ours first narrows the window in
# which a request goes out on a connection the server is closing; the one resend closes it.
KEEPALIVE_SECONDS = 4.0
_CLOSED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


@dataclass(slots=True)
class Wire:
    """What one request met, filled in by the session's trace signals while it is sent: pass
    it as ``trace_request_ctx``. A session without those signals leaves it as it is."""

    reused: bool = False  # it went out on a pooled connection
    answered: bool = False  # the response's status line and headers arrived


def _wire(context: SimpleNamespace) -> Wire | None:
    wire = context.trace_request_ctx
    return wire if isinstance(wire, Wire) else None


async def _on_reused(_session: aiohttp.ClientSession, context: SimpleNamespace, _: Any) -> None:
    if (wire := _wire(context)) is not None:
        wire.reused = True


async def _on_created(_session: aiohttp.ClientSession, context: SimpleNamespace, _: Any) -> None:
    if (wire := _wire(context)) is not None:
        wire.reused = False


async def _on_answered(_session: aiohttp.ClientSession, context: SimpleNamespace, _: Any) -> None:
    if (wire := _wire(context)) is not None:
        wire.answered = True


def _tracing() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_on_reused)
    trace.on_connection_create_end.append(_on_created)
    trace.on_request_end.append(_on_answered)  # sent once the response's headers are read
    return trace


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
        connector = aiohttp.TCPConnector(
            limit=limit, keepalive_timeout=KEEPALIVE_SECONDS, resolver=resolver,
            use_dns_cache=not guarded,
        )  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=[_tracing()])


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
