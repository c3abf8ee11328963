"""Runs: list (overall and per schedule, by status, newest first), one run with its attempts,
its whole output (streamed), cancel (pending at once, running cooperatively), and replay of a
dead run."""

from __future__ import annotations

from aiohttp import web

from promptsched.api.http import CURSOR, ID_PARAM, LIMIT, Call, Operation, Param, Reply, json_reply
from promptsched.domain import RunStatus
from promptsched.ops import lookups, schemas, views
from promptsched.ops import runs as run_ops
from promptsched.web import download

STATUS = Param("status", "query", {"type": "string", "enum": list(schemas.RUN_STATUSES)})


async def _page(call: Call, schedule_id: int | None) -> web.StreamResponse:
    limit: int = call.params["limit"]
    cursor = call.params["cursor"]
    rows = await lookups.runs_page(
        call.deps.pool,
        schedule_id=schedule_id,
        status=call.params["status"],
        owner=call.scope,
        before_id=int(cursor) if cursor else None,
        limit=limit + 1,
    )
    return json_reply(views.page([views.run(row) for row in rows], limit))


async def list_(call: Call) -> web.StreamResponse:
    return await _page(call, call.params["schedule_id"])


async def list_for_schedule(call: Call) -> web.StreamResponse:
    schedule_id = call.params["id"]
    await lookups.schedule_or_missing(call.deps.pool, schedule_id, call.scope)
    return await _page(call, schedule_id)


async def get(call: Call) -> web.StreamResponse:
    return json_reply(await run_ops.load_run(call.deps.pool, call.params["id"], call.scope))


async def output(call: Call) -> web.StreamResponse:
    assert call.request is not None, "a stream answers an HTTP request"
    rid: int = call.params["id"]
    text = await lookups.run_output(call.deps.pool, rid, call.scope)
    return await download.stream_text(call.request, text, filename=f"run-{rid}-output.txt")


async def diff(call: Call) -> web.StreamResponse:
    return json_reply(
        await run_ops.diff_runs(call.deps.pool, call.params["id"], call.params["other"], call.scope)
    )


async def cancel(call: Call) -> web.StreamResponse:
    async with call.deps.pool.acquire() as conn:
        row = await run_ops.cancel_run(
            conn, call.deps.clock, call.params["id"], owner=call.scope, actor=call.who.actor
        )
        detail = await run_ops.load_run(conn, row["id"], call.scope)
    return json_reply(detail, status=202 if detail["status"] == RunStatus.RUNNING else 200)


async def replay(call: Call) -> web.StreamResponse:
    async with call.deps.pool.acquire() as conn:
        row = await run_ops.replay_run(
            conn, call.deps.clock, call.params["id"], owner=call.scope, actor=call.who.actor
        )
        detail = await run_ops.load_run(conn, row["id"], call.scope)
    return json_reply(detail, status=201)


_MISSING = Reply("no such run (or not yours)", "Error")
_PAGE = Reply("one page of runs, newest first", "RunPage")

OPERATIONS = (
    Operation(
        "GET", "/v1/runs", list_, "listRuns", "List runs", "runs", {"200": _PAGE},
        params=(STATUS, Param("schedule_id", "query", schemas.ID), CURSOR, LIMIT),
    ),
    Operation(
        "GET", "/v1/schedules/{id}/runs", list_for_schedule, "listScheduleRuns",
        "List a schedule's runs", "runs",
        {"200": _PAGE, "404": Reply("no such schedule (or not yours)", "Error")},
        params=(ID_PARAM, STATUS, CURSOR, LIMIT),
    ),
    Operation(
        "GET", "/v1/runs/{id}", get, "getRun", "Get a run with its attempts", "runs",
        {"200": Reply("the run: output, error, skip reason and every attempt", "RunDetail"),
         "404": _MISSING},
        params=(ID_PARAM,),
    ),
    Operation(
        "GET", "/v1/runs/{id}/output", output, "getRunOutput",
        "Get a run's whole output (streamed)", "runs",
        {"200": Reply("the output as the provider answered it, whole (up to the provider "
                      "cap of 10 MB), as UTF-8 text sent in pieces with its Content-Length",
                      "RunOutput", media="text/plain"),
         "404": _MISSING,
         "409": Reply("the run has no output (not finished, or it failed)", "Error")},
        params=(ID_PARAM,),
        description="The run's output in GET /v1/runs/{id} and on the console's run page can "
        "be long; this is the same text without JSON around it, for downloading or piping. "
        "The console's run page shows a bounded excerpt of a long output and links here "
        "(its own /runs/{id}/output, by session).",
    ),
    Operation(
        "GET", "/v1/runs/{id}/diff/{other}", diff, "diffRuns",
        "What changed between two runs of a schedule", "runs",
        {"200": Reply("the JSON paths with old and new values (kind json), or a unified diff "
                      "of the text (kind text), from run id to run other", "RunDiff"),
         "404": _MISSING,
         "422": Reply("a run without output, or runs of two schedules", "Error")},
        params=(ID_PARAM, Param("other", "path", schemas.ID, required=True)),
    ),
    Operation(
        "POST", "/v1/runs/{id}/cancel", cancel, "cancelRun", "Cancel a run", "runs",
        {"200": Reply("a pending run, now cancelled (or one already cancelled)", "RunDetail"),
         "202": Reply("a running run, asked to stop: its worker's next heartbeat stops it "
                      "and it ends cancelled", "RunDetail"),
         "404": _MISSING,
         "409": Reply("the run already finished", "Error")},
        params=(ID_PARAM,),
    ),
    Operation(
        "POST", "/v1/runs/{id}/replay", replay, "replayRun", "Replay a dead run", "runs",
        {"201": Reply("the new run for the same slot (origin replay, replay_of the old id)",
                      "RunDetail"),
         "404": _MISSING,
         "409": Reply("the run is not dead, or was already replayed", "Error")},
        params=(ID_PARAM,),
    ),
)  # fmt: skip
