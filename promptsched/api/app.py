"""The aiohttp application and the API role that serves it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import asyncpg
import structlog
from aiohttp import web
from anyio.abc import TaskStatus
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from promptsched.metrics import Metrics
from promptsched.store import migrate

log = structlog.get_logger("api")

POOL: web.AppKey[asyncpg.Pool[Any]] = web.AppKey("pool", asyncpg.Pool)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
READY: web.AppKey[Callable[[], bool]] = web.AppKey("ready", Callable)  # type: ignore[arg-type]


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if not request.app[READY]():
        return web.json_response({"status": "draining"}, status=503)
    try:
        with anyio.fail_after(2):
            async with request.app[POOL].acquire() as conn:
                await migrate.check(conn)
    except Exception as exc:  # any failure to reach a current schema means "not ready"
        return web.json_response({"status": "unavailable", "error": str(exc)}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build(pool: asyncpg.Pool[Any], registry: Metrics, ready: Callable[[], bool]) -> web.Application:
    app = web.Application(client_max_size=256 * 1024)
    app[POOL] = pool
    app[METRICS] = registry
    app[READY] = ready
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


class ApiServer:
    """Serves the app on host:port (port 0 picks a free one and logs it)."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.bound_port: int | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
            server = site._server
            assert server is not None
            sockets = getattr(server, "sockets", None) or []
            self.bound_port = sockets[0].getsockname()[1] if sockets else self.port
            log.info(
                "api.listening",
                host=self.host,
                port=self.bound_port,
                url=f"http://{self.host}:{self.bound_port}",
            )
            task_status.started()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()
