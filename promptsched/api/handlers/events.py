"""A run's live progress as Server-Sent Events (``GET /v1/runs/{id}/events``), from whichever
replica executes it: ``event: progress`` per step, comments to keep the stream alive, and
``event: done`` once the run is final."""

from __future__ import annotations

from aiohttp import web

from promptsched.api.http import ID_PARAM, Call, Operation, Reply
from promptsched.web import progress


async def stream(call: Call) -> web.StreamResponse:
    assert call.request is not None, "a stream answers an HTTP request"
    return await progress.stream_run(
        call.request, pool=call.deps.pool, hub=call.deps.progress,
        run_id=call.params["id"], who=call.who, clock=call.deps.clock,
    )  # fmt: skip


OPERATIONS = (
    Operation(
        "GET", "/v1/runs/{id}/events", stream, "streamRunEvents",
        "Stream a run's live progress (Server-Sent Events)", "runs",
        {"200": Reply(
            "text/event-stream: `event: progress` per agent step ({run_id, attempt, step, "
            "max_steps, kind, text, tokens}), `: keep-alive` comments, `event: gap` when "
            "events may have been lost, and `event: done` ({run_id, status}) once the run is "
            "final, or `event: revoked` ({run_id, reason}) and the end within seconds of the "
            "token's revocation", "ServerSentEvent", media="text/event-stream"),
         "404": Reply("no such run (or not yours)", "Error")},
        params=(ID_PARAM,),
        description="Progress is ephemeral: events sent while no client listens are not "
        "replayed; the run's attempts keep the durable transcript (GET /v1/runs/{id}).",
    ),
)  # fmt: skip
