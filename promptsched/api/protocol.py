"""The HTTP server's connections: a request aiohttp's parser rejects (a header or the request
line too long, a malformed header, bad framing) is answered with the API's JSON error body and
logged without any of its bytes, which may hold a bearer token or a session cookie."""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from aiohttp import web, web_request
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


def describe(exc: BaseException | None) -> tuple[int, str, str]:
    """``(status, code, message)`` for a request the HTTP parser rejected; never its content."""
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


def error_response(status: int, code: str, message: str) -> web.Response:
    """The API's error body, on a connection that is closed after it."""
    body = {"code": code, "message": message, "field": None, "request_id": uuid.uuid4().hex}
    response = web.json_response({"error": body}, status=status)
    response.force_close()
    return response


class Protocol(web.RequestHandler):
    """aiohttp's connection handler, with its error page replaced (see the module docstring).
    Errors a handler raises never get here: the app's middleware answers them."""

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
    """The connection factory: every connection gets a ``Protocol``."""

    def __call__(self) -> web.RequestHandler:
        return Protocol(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """``web.AppRunner`` serving through ``Server``: the app's lifecycle (startup, cleanup)
    is AppRunner's own; only the connection class differs."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = Server  # adds behaviour only: no state of its own
        return server
