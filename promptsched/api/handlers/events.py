"""A run's live progress as Server-Sent Events (``GET /v1/runs/{id}/events``), from whichever
replica executes it: ``event: progress`` per step, comments to keep the stream alive, and
``event: done`` once the run is final."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import asyncpg
import structlog
from aiohttp import web

from promptsched import errors
from promptsched.api.http import ID_PARAM, Call, Operation, Reply
from promptsched.domain import RunStatus
from promptsched.store import queries
from promptsched.web.progress import GAP, Subscription

log = structlog.get_logger("api")
# A stream ends once its run is final (or was deleted with its schedule).
ENDED = frozenset({*(s.value for s in RunStatus if s.finished), "deleted"})
RETRY_MS = 2000  # how long an EventSource waits before reconnecting


def frame(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def stream(call: Call) -> web.StreamResponse:
    run_id: int = call.params["id"]
    deps, hub = call.deps, call.deps.progress
    # Subscribe before reading the status: an event in between is queued, not lost.
    with hub.subscribe(run_id) as subscription:
        status = await queries.run_get_status(deps.pool, run_id, call.scope)
        if status is None:
            raise errors.NotFound("run", run_id)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # nginx: pass events through at once
            }
        )
        await response.prepare(call.request)
        try:
            await response.write(f"retry: {RETRY_MS}\n: watching run {run_id}\n\n".encode())
            await _pump(call, response, subscription, status)
        except ConnectionError:  # the client went away
            pass
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # The response has started: no error body any more. End it; the client reconnects.
            log.warning("api.stream_failed", run_id=run_id, error=repr(exc))
            with contextlib.suppress(ConnectionError):
                await response.write(b": the stream failed; reconnect\n\n")
        return response


async def _pump(
    call: Call, response: web.StreamResponse, subscription: Subscription, status: str
) -> None:
    run_id: int = call.params["id"]
    hub = call.deps.progress
    deadline = anyio.current_time() + hub.max_stream
    last_write = anyio.current_time()
    while status not in ENDED:
        left = deadline - anyio.current_time()
        if left <= 0:
            await response.write(b": stream time limit reached; reconnect to go on\n\n")
            return
        for event in await subscription.next(min(hub.poll, left)):
            if event is GAP:  # the listener reconnected: events may have been lost
                await response.write(frame("gap", {"run_id": run_id}))
            else:
                await response.write(frame("progress", event))
            last_write = anyio.current_time()
        if anyio.current_time() - last_write >= hub.keepalive:
            await response.write(b": keep-alive\n\n")
            last_write = anyio.current_time()
        status = await queries.run_get_status(call.deps.pool, run_id, call.scope) or "deleted"
    await response.write(frame("done", {"run_id": run_id, "status": status}))


OPERATIONS = (
    Operation(
        "GET", "/v1/runs/{id}/events", stream, "streamRunEvents",
        "Stream a run's live progress (Server-Sent Events)", "runs",
        {"200": Reply(
            "text/event-stream: `event: progress` per agent step ({run_id, attempt, step, "
            "max_steps, kind, text, tokens}), `: keep-alive` comments, `event: gap` when "
            "events may have been lost, and `event: done` ({run_id, status}) once the run is "
            "final", "Text", media="text/event-stream"),
         "404": Reply("no such run (or not yours)", "Error")},
        params=(ID_PARAM,),
        description="Progress is ephemeral: events sent while no client listens are not "
        "replayed; the run's attempts keep the durable transcript (GET /v1/runs/{id}).",
    ),
)  # fmt: skip
