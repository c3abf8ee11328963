"""The fleet for operators (admin tokens): ``GET /v1/status``, the replicas, providers, queue
and outbox at a glance."""

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


_FORBIDDEN = Reply("a token that is not an admin's", "Error")

OPERATIONS = (
    Operation(
        "GET", "/v1/status", status, "fleetStatus", "The fleet at a glance", "fleet",
        {"200": Reply("replicas (version, uptime, duties, in flight, last renewal, drift), "
                      "providers (breaker, room, pacing), the queue and the outbox",
                      "FleetStatus"),
         "403": _FORBIDDEN},
    ),
)  # fmt: skip
