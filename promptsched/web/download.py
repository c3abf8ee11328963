"""A stored text sent whole, in pieces as the client reads them: a run's output, for the API
(``GET /v1/runs/{id}/output``) and the console (``/runs/{id}/output``) alike, so an answer of
up to a provider's 10 MB is never built into a page nor written in one piece."""

from __future__ import annotations

from aiohttp import web

CHUNK = 256 * 1024  # bytes per write; each waits until the connection has taken the last


async def stream_text(request: web.Request, text: str, *, filename: str) -> web.StreamResponse:
    """``text`` as ``text/plain; charset=utf-8`` with its length, shown by a browser rather than
    read as anything else (``nosniff``), never cached (it is the owner's)."""
    data = text.encode()
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Disposition": f'inline; filename="{filename}"',
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-store",
        }
    )
    response.content_length = len(data)
    await response.prepare(request)
    view = memoryview(data)
    for start in range(0, len(data), CHUNK):
        await response.write(view[start : start + CHUNK])
    await response.write_eof()
    return response
