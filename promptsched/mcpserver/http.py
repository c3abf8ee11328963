"""``/mcp`` on the service: MCP Streamable HTTP on the API's own port, the SDK's transport
(stateless, JSON answers: any replica answers any request, so a fleet behind a load balancer
needs no session affinity) bridged into aiohttp. Every request is authenticated with the API's
bearer tokens, so a revoked token is refused on its next call, and each tool answers for the
token's owner exactly as ``/v1`` does."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web
from multidict import CIMultiDict

from promptsched.mcpserver import server as mcp_server
from promptsched.mcpserver.gateway import InProcess
from promptsched.web import auth
from promptsched.web.deps import DEPS, Deps

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

PATH = "/mcp"
PRINCIPAL = "promptsched.principal"  # the ASGI scope's key for the request's principal
UNAUTHORIZED = (
    "unauthorized: this token is unknown, expired or revoked; promptsched's /mcp needs "
    "Authorization: Bearer TOKEN with a valid API token (promptsched tokens create)"
)
_CHALLENGE = 'Bearer realm="promptsched"'
REFUSED = -32001  # JSON-RPC's implementation-defined server errors: the request was refused
# Headers of the SDK's answer that aiohttp writes itself.
_OWN_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


def prepare() -> None:
    """Import the SDK's server side now: a service calls this before its roles start, so the
    second or more it takes never stalls a loop that already holds leases (the CLI imports
    this module too, and keeps its own start fast by not calling it)."""
    import mcp.server.lowlevel
    import mcp.server.streamable_http_manager
    import mcp.shared.exceptions  # noqa: F401


class Endpoint:
    """The SDK's session manager, run for the application's lifetime in a task of its own
    (it holds a task group that must be entered and left in one task)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.manager: StreamableHTTPSessionManager | None = None
        self._task: asyncio.Task[None] | None = None

    def gateway(self, ctx: ServerRequestContext[Any, Any]) -> InProcess:
        request = ctx.request
        principal = request.scope.get(PRINCIPAL) if request is not None else None
        assert isinstance(principal, auth.Principal), "every /mcp request is authenticated"
        return InProcess(self.deps, principal)

    async def start(self, app: web.Application) -> None:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        from promptsched.ops import fleet

        server = mcp_server.build(self.gateway, version=fleet.VERSION)
        manager = StreamableHTTPSessionManager(app=server, json_response=True, stateless=True)
        started = asyncio.Event()

        async def hold() -> None:
            async with manager.run():
                started.set()
                await asyncio.Event().wait()  # until the application stops

        self._task = asyncio.create_task(hold(), name="mcp-http")
        waiting = asyncio.create_task(started.wait())
        await asyncio.wait({self._task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if not started.is_set():
            waiting.cancel()
            await self._task  # its error
        self.manager = manager

    async def stop(self, app: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":  # stateless: no stream to GET, no session to DELETE
            raise web.HTTPMethodNotAllowed(request.method, ["POST"])
        principal = await auth.authenticate(request, self.deps.pool, self.deps.clock)
        if principal is None:  # missing, unknown or revoked: the client reads why
            return await _refusal(request, 401, UNAUTHORIZED, {"WWW-Authenticate": _CHALLENGE})
        if self.manager is None:
            return await _refusal(request, 503, "the MCP endpoint is starting or stopping", {})
        return await _asgi(request, self.manager.handle_request, {PRINCIPAL: principal})


async def _refusal(
    request: web.Request, status: int, message: str, headers: dict[str, str]
) -> web.Response:
    """A refusal before the MCP layer, as a JSON-RPC error for the request's id (the SDK's
    client shows its message, where it would only say that the server answered an error)."""
    try:
        message_id = json.loads(await request.read()).get("id")
    except (ValueError, AttributeError, web.HTTPException):
        message_id = None
    body = {"jsonrpc": "2.0", "id": message_id if isinstance(message_id, str | int) else None,
            "error": {"code": REFUSED, "message": message}}  # fmt: skip
    return web.json_response(body, status=status, headers=headers)


async def _asgi(request: web.Request, app: Any, extra: dict[str, Any]) -> web.Response:
    """One request through an ASGI application, its whole answer buffered (JSON mode: one
    JSON-RPC answer, or 202 for a notification)."""
    body = await request.read()  # the API's body limit applies
    host, port = (request.url.host or "localhost"), (request.url.port or 80)
    peer = request.transport.get_extra_info("peername") if request.transport else None
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode(),
        "query_string": request.query_string.encode(),
        "root_path": "",
        "headers": [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()
        ],  # fmt: skip
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": (host, port),
        "state": {},
        **extra,
    }
    delivered = False
    finished = asyncio.Event()
    status = 500
    headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers.extend(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])
            )
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    kept = CIMultiDict((k, v) for k, v in headers if k.lower() not in _OWN_HEADERS)
    return web.Response(status=status, body=b"".join(chunks), headers=kept)


def mount(app: web.Application) -> None:
    """Add ``/mcp`` to the API's application (the supervisor mounts it, as the console)."""
    endpoint = Endpoint(app[DEPS])
    app.router.add_route("*", PATH, endpoint.handle)
    app.on_startup.append(endpoint.start)
    app.on_cleanup.append(endpoint.stop)
