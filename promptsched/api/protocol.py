"""The HTTP server's connections: a request aiohttp's parser rejects (a header or the request
line too long, a malformed header, bad framing) is answered with the API's JSON error body and
logged without any of its bytes, which may hold a bearer token or a session cookie. Every
connection is bounded (``Limits``): an idle keep-alive connection closes, a request whose
headers or body do not arrive in time is answered 408 and closed, and past the cap of open
connections a new one is answered 503 at once (the liveness probe ``/healthz`` 200; past the
cap's overflow, closed unanswered), so slow or idle clients never use up the process's file
descriptors."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import streams, web, web_request
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)

from promptsched.metrics import Metrics
from promptsched.web import edge
from promptsched.web.deps import DEPS

log = structlog.get_logger("api")

# Room for the longest request line the document allows (a 2000-character preview expression,
# percent-encoded), so no documented request meets the parser's own limit.
MAX_LINE = 64 * 1024
MAX_FIELD = 8190  # one header line, name and value (aiohttp's default)
MAX_HEADERS = 128
RUNNER_OPTIONS: dict[str, Any] = {
    "access_log": None,
    "max_line_size": MAX_LINE,
    "max_field_size": MAX_FIELD,
    "max_headers": MAX_HEADERS,
}

# What a parser error means, in words of our own: aiohttp's messages quote the offending bytes.
_FIXED: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (BadHttpMethod, "the request method is not a valid HTTP method"),
    (BadStatusLine, "the request line is not valid HTTP/1.1"),
    (InvalidURLError, "the request target is not a valid URL"),
    (InvalidHeader, "a header is malformed"),
    (ContentLengthError, "the body does not match its Content-Length"),
    (TransferEncodingError, "the body's Transfer-Encoding is malformed"),
)


class RequestTimeout(HttpProcessingError):
    """A request's body did not arrive within ``Limits.body`` (set on the body being read)."""

    code = 408


def describe(exc: BaseException | None) -> tuple[int, str, str]:
    """``(status, code, message)`` for a request the HTTP parser rejected; never its content."""
    if isinstance(exc, RequestTimeout):
        return 408, "request_timeout", exc.message
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else None
        if limit == MAX_LINE:
            return 414, "uri_too_long", f"the request line is longer than {MAX_LINE} bytes"
        return (
            431,
            "header_too_large",
            f"a header is longer than {MAX_FIELD} bytes (an Authorization header or a cookie, "
            "perhaps): send a shorter one",
        )
    if isinstance(exc, HttpProcessingError) and exc.message == "Too many headers received":
        return 431, "header_too_large", f"the request has more than {MAX_HEADERS} headers"
    if isinstance(exc, HttpProcessingError) and exc.message.startswith("Content-Length overflow"):
        return 413, "too_large", "the declared Content-Length is larger than any body we accept"
    if isinstance(exc, web.RequestPayloadError):
        return 400, "bad_request", "the body's framing or encoding is malformed"
    for kind, message in _FIXED:
        if isinstance(exc, kind):
            return 400, "bad_request", message
    return 400, "bad_request", "the request is not valid HTTP/1.1 (a header is malformed)"


def _error_body(code: str, message: str) -> dict[str, Any]:
    body = {"code": code, "message": message, "field": None, "request_id": uuid.uuid4().hex}
    return {"error": body}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """The API's error body, on a connection that is closed after it (no application is
    behind it, so the edge's headers are set here)."""
    response = web.json_response(_error_body(code, message), status=status, headers=headers)
    response.headers["Server"] = edge.SERVER
    response.headers.setdefault(*edge.NOSNIFF)
    response.force_close()
    return response


def _raw_error(status: str, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response, for a connection with no request to answer through."""
    body = json.dumps(_error_body(code, message)).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: {edge.SERVER}\r\n"
        f"{edge.NOSNIFF[0]}: {edge.NOSNIFF[1]}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a connection may idle between requests, how long a request's headers (from its
    first byte) and then its body may take to arrive, and how many client connections may be
    open at once (``cap``). Defaults: docs/deploying.md#connections-are-bounded."""

    idle: float = 75.0
    headers: float = 10.0
    body: float = 60.0
    max_connections: int = 4096

    def cap(self, open_files: int | None) -> int:
        """The connections served at once: ``max_connections``, but no more than half the
        open-files limit, which leaves the other half for the database pool, the providers,
        the mail server, the MCP servers and the over-cap answers."""
        if open_files is None or open_files <= 0:
            return self.max_connections
        return max(1, min(self.max_connections, open_files // 2))


# The listening socket's queue of connections not yet accepted (the kernel caps it at
# net.core.somaxconn): aiohttp's 128 drops a burst's handshakes whenever the loop is busy for a
# moment, and each dropped one waits a second for the client's retry.
BACKLOG = 1024

# A connection over the cap has this long to send its request before it is closed; it is
# answered 503 at once. Past the overflow (an eighth of the cap, at least 16 at a time) a new
# connection is closed without an answer.
OVER_CAP_GRACE = 1.0
BUSY = "the server has as many connections open as it serves; try again in a moment"
FULL_LOG_EVERY = 60.0  # seconds between two api.connections_full warnings

_SERVED, _OVER, _REFUSED = "served", "over", "refused"


async def _busy(request: web.BaseRequest) -> web.StreamResponse:
    return error_response(503, "busy", BUSY, headers={"Retry-After": "1"})


def _liveness(request: web.BaseRequest) -> bool:
    """The liveness probe, answered even over the cap: it does no database work, and a full
    process is alive (its readiness, ``/readyz``, is answered 503 like everything else)."""
    return request.method in ("GET", "HEAD") and request.path == "/healthz"


def _alive(handler: Any) -> Any:
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        response.force_close()  # an over-cap connection never stays open
        return response

    return answer


class Protocol(web.RequestHandler):
    """aiohttp's connection handler, with its error page replaced and its connection bounded
    (see the module docstring). Errors a handler raises never get here: the app's middleware
    answers them."""

    __slots__ = ("_body", "_deadline", "_place")

    def __init__(self, manager: Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._body: streams.StreamReader | None = None  # a body arriving under its deadline
        self._place = _SERVED

    @property
    def _server(self) -> Server:
        assert isinstance(self._manager, Server)
        return self._manager

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        self._place = server.admit()
        if self._place == _REFUSED:
            transport.close()
            return
        super().connection_made(transport)
        if self._place == _OVER:
            self.keep_alive(False)
            self._arm(OVER_CAP_GRACE, self._headers_late)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._place == _REFUSED:
            return  # never admitted: nothing of it is registered
        self._disarm()
        self._body = None
        if self._manager is not None:
            self._server.release(self._place)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._place == _REFUSED:
            return
        if data and self._deadline is None and self._body is None:
            self._arm(self._server.limits.headers, self._headers_late)  # a request begins
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:  # its headers are complete
            self._disarm()
            payload = self._messages[-1][1] if self._messages else None
            if payload is not None and not payload.is_eof():
                self._body = payload
                self._arm(self._server.limits.body, self._body_late)
        elif self._body is not None and self._body.is_eof():
            self._body = None
            self._disarm()

    async def _handle_request(self, request: Any, start_time: Any, request_handler: Any) -> Any:
        handler = request_handler
        if self._place == _OVER:
            handler = _alive(request_handler) if _liveness(request) else _busy
        return await super()._handle_request(request, start_time, handler)

    def _arm(self, seconds: float, then: Any) -> None:
        self._disarm()
        self._deadline = self._loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        """The request's headers did not all arrive in time: 408, and the connection ends."""
        self._deadline = None
        if self.transport is None:
            return
        log.debug("api.request_timeout", phase="headers", place=self._place)
        if self._place == _SERVED:
            self._server.timed_out("headers")
        if self._request_in_progress:  # a pipelined request behind one being answered
            self.close()
            return
        if self._place == _OVER:
            self.transport.write(_raw_error("503 Service Unavailable", "busy", BUSY))
        else:
            late = f"the request's headers did not arrive within {self._server.limits.headers:g}s"
            self.transport.write(_raw_error("408 Request Timeout", "request_timeout", late))
        self.force_close()

    def _body_late(self) -> None:
        """The body did not arrive in time: a handler reading it gets ``RequestTimeout`` (the
        middleware answers 408) and the connection closes after the answer."""
        self._deadline = None
        body, self._body = self._body, None
        if body is None or body.is_eof() or self.transport is None:
            return
        late = RequestTimeout(
            message=f"the request's body did not arrive within {self._server.limits.body:g}s"
        )
        log.debug("api.request_timeout", phase="body", place=self._place)
        if self._place == _SERVED:
            self._server.timed_out("body")
        if any(queued is body for _, queued in self._messages):  # its handler has not started
            body.set_exception(late)
            self.force_close()
        elif self._request_in_progress:
            self._lingering_time = 0.0  # nothing more is read after the answer
            self.close()
            body.set_exception(late)
        else:  # the answer is sent and the rest was being read and dropped
            body.feed_eof()
            self.force_close()

    def handle_error(
        self,
        request: web_request.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # a response is under way: nothing else can be sent
            raise ConnectionError("the response was already started")
        if isinstance(exc, HttpProcessingError):
            status, code, text = describe(exc)
            # A port scanner's first bytes are common; anything else is worth an info line.
            level = "debug" if isinstance(exc, BadHttpMethod) else "info"
            getattr(log, level)(
                "api.bad_http_request",
                status=status,
                problem=type(exc).__name__,
                remote=request.remote,
            )
            return error_response(status, code, text)
        if status == 504:
            return error_response(504, "timeout", "the request took too long")
        log.error("api.unhandled_error", status=status, exc_info=exc)
        return error_response(500, "internal", "unexpected server error")


class Server(web.Server):
    """The connection factory: every connection gets a ``Protocol``; counts the connections
    open within the cap and over it."""

    limits: Limits
    cap: int
    overflow: int
    served: int
    over: int
    metrics: Metrics | None
    _full_logged: float

    def setup(self, limits: Limits, cap: int, metrics: Metrics | None) -> None:
        self.limits, self.cap, self.overflow = limits, cap, max(16, cap // 8)
        self.served = self.over = 0
        self.metrics = metrics
        self._full_logged = -FULL_LOG_EVERY

    def __call__(self) -> web.RequestHandler:
        return Protocol(self, loop=self._loop, **self._kwargs)

    def admit(self) -> str:
        if self.served < self.cap:
            self.served += 1
            if self.metrics is not None:
                self.metrics.http_connections.set(self.served)
            return _SERVED
        now = time.monotonic()
        if now - self._full_logged >= FULL_LOG_EVERY:
            self._full_logged = now
            log.warning("api.connections_full", cap=self.cap, over=self.over)
        place = _OVER if self.over < self.overflow else _REFUSED
        if place == _OVER:
            self.over += 1
        if self.metrics is not None:
            reason = "over_cap" if place == _OVER else "overflow"
            self.metrics.http_connections_refused.labels(reason).inc()
        return place

    def release(self, place: str) -> None:
        if place == _SERVED:
            self.served -= 1
            if self.metrics is not None:
                self.metrics.http_connections.set(self.served)
        elif place == _OVER:
            self.over -= 1

    def timed_out(self, phase: str) -> None:
        if self.metrics is not None:
            self.metrics.http_request_timeouts.labels(phase).inc()


class Runner(web.AppRunner):
    """``web.AppRunner`` serving through ``Server``: the app's lifecycle (startup, cleanup)
    is AppRunner's own; the connection class and its limits differ. ``open_files`` is the
    process's open-files limit, which lowers the cap when it is small."""

    def __init__(
        self,
        app: web.Application,
        *,
        limits: Limits | None = None,
        open_files: int | None = None,
        **kwargs: Any,
    ) -> None:
        self._limits = limits or Limits()
        self._cap = self._limits.cap(open_files)
        super().__init__(app, keepalive_timeout=self._limits.idle, **kwargs)

    @property
    def cap(self) -> int:
        return self._cap

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = Server
        assert isinstance(server, Server)
        deps = self._app.get(DEPS)
        server.setup(self._limits, self._cap, deps.metrics if deps is not None else None)
        return server
