"""Fakes of external services that tests run for real over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


@asynccontextmanager
async def serve(
    app: web.Application, *, release: asyncio.Event | None = None, **runner_options: Any
) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 at a free port; yields its base URL (``http://host:port``).
    On the way out ``release`` (if given) is set, so that handlers it holds can finish, and
    then the runner is cleaned up."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        if release is not None:
            release.set()
        await runner.cleanup()
