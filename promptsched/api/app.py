"""The aiohttp application (routes from the operation table, the error middleware) and the API
role that serves it."""

from __future__ import annotations

import errno
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from anyio.abc import TaskStatus

from promptsched import netguard
from promptsched.api import openapi, protocol
from promptsched.api.handlers import (
    budgets,
    controls,
    events,
    explain,
    fleet,
    followups,
    meta,
    notifications,
    runs,
    schedules,
)
from promptsched.api.http import ApiError, Operation, endpoint
from promptsched.clock import Clock
from promptsched.errors import (
    ConfigError,
    NotFound,
    QuotaExceeded,
    StateConflict,
    ValidationError,
    VersionConflict,
)
from promptsched.metrics import Metrics
from promptsched.ops import fleet as fleet_ops
from promptsched.ops import lookups, validate
from promptsched.tools.base import Catalog
from promptsched.web import edge as edges
from promptsched.web.deps import DEPS, Deps
from promptsched.web.progress import ProgressHub
from promptsched.web.ratelimit import TokenRates

log = structlog.get_logger("api")

MAX_BODY = 1024 * 1024  # a 100k-character prompt, JSON-escaped, fits
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.InternalClientError,  # a connection caught mid-operation by a server restart
)
RUNNER_OPTIONS = protocol.RUNNER_OPTIONS  # the HTTP parser's limits; no access log
_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}
_TOO_LARGE = f"the body is larger than {MAX_BODY} bytes"


OPERATIONS: tuple[Operation, ...] = (
    *schedules.OPERATIONS,
    *controls.OPERATIONS,
    *explain.OPERATIONS,
    *runs.OPERATIONS,
    *events.OPERATIONS,
    *notifications.OPERATIONS,
    *budgets.OPERATIONS,
    *followups.OPERATIONS,
    *fleet.OPERATIONS,
    *meta.OPERATIONS,
)


def _error(
    status: int,
    code: str,
    message: str,
    request_id: str,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"code": code, "message": message, "field": field, "request_id": request_id}
    return web.json_response({"error": body}, status=status, headers=headers)


def _known_error(exc: Exception, request_id: str) -> web.Response | None:
    """The response for an error the API raises on purpose; None for anything else."""
    if isinstance(exc, validate.Malformed):
        return _error(400, "malformed_json", exc.message, request_id, field=exc.field or None)
    if isinstance(exc, QuotaExceeded):
        return _error(409, "quota_exceeded", exc.message, request_id, field=exc.field)
    if isinstance(exc, ValidationError):
        return _error(422, "invalid", exc.message, request_id, field=exc.field)
    if isinstance(exc, ApiError):
        return _error(
            exc.status, exc.code, exc.message, request_id, field=exc.field, headers=exc.headers
        )
    if isinstance(exc, NotFound):
        return _error(404, "not_found", str(exc), request_id)
    if isinstance(exc, VersionConflict):
        return _error(409, "version_conflict", str(exc), request_id, field="version")
    if isinstance(exc, StateConflict):
        return _error(409, "conflict", str(exc), request_id)
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        code = _HTTP_CODES.get(exc.status, "http_error")
        message = _TOO_LARGE if exc.status == 413 else exc.reason
        return _error(exc.status, code, message, request_id, headers=headers)
    if isinstance(exc, protocol.RequestTimeout):  # the body came too slowly (protocol.Limits)
        return _error(408, "request_timeout", exc.message, request_id)
    if isinstance(exc, HttpProcessingError | web.RequestPayloadError):
        # The body's framing broke while it was read (bad chunking, a short body, bad gzip):
        # the client's fault, described without quoting it.
        _, code, message = protocol.describe(exc)
        return _error(400, code, message, request_id)
    return None


def error_answer(exc: Exception, request_id: str) -> tuple[int, dict[str, Any]] | None:
    """The status and ``error`` object the API answers for ``exc`` (an error it raises on
    purpose, or the database out of reach); None for anything else, which is a bug of ours.
    For operations called in-process (``http.invoke``), worded as over HTTP."""
    if isinstance(exc, _UNAVAILABLE):
        return 503, {"code": "unavailable", "message": "the database is unreachable",
                     "field": None, "request_id": request_id}  # fmt: skip
    response = _known_error(exc, request_id)
    if response is None:
        return None
    assert isinstance(response.body, bytes)
    error: dict[str, Any] = json.loads(response.body)["error"]
    return response.status, error


async def _refuse_declared_size(request: web.Request, request_id: str) -> web.StreamResponse:
    """413 at once by the declared Content-Length, instead of waiting for a body that may
    never come; then the connection closes rather than lingering to read what is left."""
    refused = _error(413, "too_large", _TOO_LARGE, request_id)
    refused.headers["X-Request-Id"] = request_id
    refused.force_close()
    await refused.prepare(request)
    await refused.write_eof()
    request.protocol.force_close()  # the answer is flushed before the socket closes
    return refused


@web.middleware
async def errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turns every error into a JSON body; an unexpected one into a 500 with a logged id."""
    given = request.headers.get("X-Request-Id", "")
    request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    declared = request.content_length
    if declared is not None and declared > MAX_BODY:
        return await _refuse_declared_size(request, request_id)
    try:
        response = await lookups.retry_stale(lambda: handler(request))
    except Exception as exc:
        known = _known_error(exc, request_id)
        if known is not None:
            response = known
        elif isinstance(exc, web.HTTPException):
            raise  # a redirect or similar: not an error
        elif isinstance(exc, _UNAVAILABLE):
            log.warning("api.unavailable", request_id=request_id, error=repr(exc))
            response = _error(503, "unavailable", "the database is unreachable", request_id)
        else:
            log.exception(
                "api.unexpected_error",
                request_id=request_id,
                method=request.method,
                path=request.path,  # never the query or headers: they may carry secrets
            )
            response = _error(500, "internal", "unexpected server error", request_id)
    response.headers["X-Request-Id"] = request_id
    return response


def build(
    pool: asyncpg.Pool[Any],
    registry: Metrics,
    ready: Callable[[], bool],
    *,
    clock: Clock | None = None,
    providers: Collection[str] = ("echo",),
    provider_kinds: Mapping[str, str] | None = None,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
    tools: Callable[[], Catalog] | None = None,
    progress: ProgressHub | None = None,
    retention: timedelta | None = None,
    published: Callable[[], Mapping[str, Any]] | None = None,
    doctor: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    mounts: Sequence[Callable[[web.Application], None]] = (),
    edge: edges.Edge | None = None,
    max_schedules: int = 0,
    rates: TokenRates | None = None,
) -> web.Application:
    """``tools`` gives the server's tool catalog (agent schedules are checked against it);
    ``progress`` is the hub the process's listener feeds (run event streams read it);
    ``mounts`` add routes outside the API's paths after the API's own (the composition root
    mounts the operator console this way, so the API never imports it); ``edge`` says which
    proxies are trusted and whether the public URL is https (every response's headers)."""
    ops = OPERATIONS
    kinds = {name: (provider_kinds or {}).get(name, "echo") for name in providers}
    if published is None:  # no replica behind it: its own providers and allowlist
        document = fleet_ops.bare_document(kinds, webhook_allow)
        published = lambda: document  # noqa: E731
    deps = Deps(
        pool=pool,
        clock=clock or Clock(),
        metrics=registry,
        ready=ready,
        providers=tuple(providers),
        provider_kinds=dict(provider_kinds or {}),
        webhook_allow=webhook_allow,
        document=openapi.document(ops),
        tools=tools,
        progress=progress or ProgressHub(),
        retention=retention,
        published=published,
        doctor=doctor,
        max_schedules=max_schedules,
        rates=rates or TokenRates(0.0, 1),
    )
    app = web.Application(client_max_size=MAX_BODY, middlewares=[errors])
    app[DEPS] = deps
    app[edges.EDGE] = edge or edges.Edge()
    app.on_response_prepare.append(edges.headers)
    for op in ops:
        app.router.add_route(op.method, op.path, endpoint(op, deps))
    for mount in mounts:
        mount(app)
    return app


_LISTEN_WORDS = {
    errno.EADDRINUSE: "is in use (another promptsched, or another program)",
    errno.EACCES: "needs privileges this user does not have (ports below 1024)",
    errno.EADDRNOTAVAIL: "is not an address of this machine",
}


def listen_error(host: str, port: int, exc: OSError) -> ConfigError:
    """Why the API cannot listen, and what to do, in the words of the settings."""
    why = _LISTEN_WORDS.get(exc.errno or 0, exc.strerror or str(exc))
    return ConfigError(
        "PROMPTSCHED_HTTP_PORT",
        f"cannot listen on {host}:{port}: it {why}; stop what holds it, or choose another port "
        "with --http-port N or PROMPTSCHED_HTTP_PORT (0 picks a free one)",
    )


class ApiServer:
    """Serves the app on host:port (port 0 picks a free one and logs it), its connections
    bounded by ``limits`` (the cap lowered to half of ``open_files``, the process's limit)."""

    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        *,
        limits: protocol.Limits | None = None,
        open_files: int | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.limits = limits or protocol.Limits()
        self.open_files = open_files
        self.bound_port: int | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        runner = protocol.Runner(
            self.app,
            handle_signals=False,
            limits=self.limits,
            open_files=self.open_files,
            **RUNNER_OPTIONS,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=protocol.BACKLOG)
        try:
            try:
                await site.start()
            except OSError as exc:
                raise listen_error(self.host, self.port, exc) from None
            server = site._server
            assert server is not None
            sockets = getattr(server, "sockets", None) or []
            self.bound_port = sockets[0].getsockname()[1] if sockets else self.port
            log.info(
                "api.listening",
                host=self.host,
                port=self.bound_port,
                url=f"http://{self.host}:{self.bound_port}",
                max_connections=runner.cap,
                idle_timeout=self.limits.idle,
                header_timeout=self.limits.headers,
                body_timeout=self.limits.body,
            )
            task_status.started()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()
