"""GET /v1/schedules/{id}/explain: why a schedule did (or will) fire or not at an instant."""

from __future__ import annotations

from aiohttp import web

from promptsched import offload
from promptsched.api.http import ID_PARAM, Call, Operation, Param, Reply, json_reply
from promptsched.ops import explain, lookups
from promptsched.ops import schedules as schedule_ops


async def explain_slot(call: Call) -> web.StreamResponse:
    schedule_id = call.params["id"]
    async with call.deps.pool.acquire() as conn:
        row = await lookups.schedule_or_missing(conn, schedule_id, call.scope)
        at, note = explain.resolve_at(call.params["at"], row)
        now = await schedule_ops.db_now(conn, call.deps.clock)
        changes, runs = await lookups.slot_history(conn, schedule_id, at)
    facts = explain.Facts(row, at, now, changes, runs, retention=call.deps.retention, note=note)
    return json_reply(await offload.run(lambda: explain.explain(facts)))


OPERATIONS = (
    Operation(
        "GET", "/v1/schedules/{id}/explain", explain_slot, "explainSchedule",
        "Why did (or will) the schedule fire or not at an instant", "schedules",
        {"200": Reply("the verdict, a sentence, the runs of that slot and the nearest fire "
                      "times", "Explanation"),
         "404": Reply("no such schedule (or not yours)", "Error")},
        params=(
            ID_PARAM,
            Param("at", "query", {"type": "string", "minLength": 1, "maxLength": 64},
                  required=True,
                  description="ISO-8601 date-time; without an offset it is read in the "
                  "schedule's time zone"),
        ),
    ),
)  # fmt: skip
