"""The fleet for operators (admin tokens): ``GET /v1/status``, the replicas, providers, queue
and outbox at a glance; ``GET /v1/doctor``, the answering replica's configuration checked."""

from __future__ import annotations

from aiohttp import web

from promptsched.api.http import ApiError, Call, Operation, Reply, json_reply
from promptsched.ops import status as fleet_status

ADMINS_ONLY = "the fleet's status is for admin tokens (tokens create --admin)"


def _admin(call: Call) -> None:
    if call.scope is not None:
        raise ApiError(403, "forbidden", ADMINS_ONLY)


async def status(call: Call) -> web.StreamResponse:
    _admin(call)
    return json_reply(await fleet_status.gather(call.deps.pool, call.deps.clock))


async def doctor(call: Call) -> web.StreamResponse:
    _admin(call)
    if call.deps.doctor is None:
        raise ApiError(503, "unavailable", "doctor runs in a replica started by promptsched run")
    return json_reply(await call.deps.doctor())


_FORBIDDEN = Reply("a token that is not an admin's", "Error")

OPERATIONS = (
    Operation(
        "GET", "/v1/status", status, "fleetStatus", "The fleet at a glance", "fleet",
        {"200": Reply("replicas (version, uptime, duties, in flight, last renewal, drift), "
                      "providers (breaker, room, pacing), the queue and the outbox",
                      "FleetStatus"),
         "403": _FORBIDDEN},
    ),
    Operation(
        "GET", "/v1/doctor", doctor, "fleetDoctor",
        "Check this replica's configuration against what it needs", "fleet",
        {"200": Reply("one verdict per check (database, clock, pooler, providers, SMTP, "
                      "targets, public URL, fleet), each with the fix when it fails; ok is "
                      "false when something a configured feature needs is broken", "Doctor"),
         "403": _FORBIDDEN,
         "503": Reply("no replica behind this application", "Error")},
        description="It makes a cheap request to each provider (its model list) and logs in "
        "to SMTP without sending anything; it takes up to about ten seconds.",
    ),
)  # fmt: skip
