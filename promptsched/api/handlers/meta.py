"""Preview of fire times (pure schedule math, nothing created), health, readiness, metrics
and the OpenAPI document."""

from __future__ import annotations

from datetime import datetime

import anyio
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from promptsched import offload
from promptsched.api.http import Call, Operation, Param, Reply, json_reply
from promptsched.errors import SchemaMismatch
from promptsched.ops import lookups, schemas, validate, views
from promptsched.ops import schedules as schedule_ops
from promptsched.schedule import spec

MAX_PREVIEW = 100
READY_TIMEOUT = 2  # seconds

log = structlog.get_logger("api")

LISTENER_DOWN = (
    "the listener's test notification did not come back: wake-ups are lost (is LISTEN going "
    "through a transaction pooler? set PROMPTSCHED_DIRECT_DATABASE_URL)"
)


async def preview(call: Call) -> web.StreamResponse:
    """The next fire times, by the code path the scheduler uses; nothing is stored. The math
    runs off the event loop (bounded work, see docs/scheduling.md)."""
    p = call.params
    options = {"dst_gap": p["dst_gap"], "dst_fold": p["dst_fold"]}
    start = (
        validate.instant(p["from"], "from")
        if p["from"] is not None
        else await schedule_ops.db_now(call.deps.pool, call.deps.clock)
    )

    def compute() -> tuple[spec.Spec, list[datetime]]:
        if p["kind"] is not None:
            parsed = spec.parse(p["kind"], p["expression"], p["timezone"], **options)
        else:
            parsed = spec.parse_line(p["expression"], p["timezone"], **options)
        return parsed, schedule_ops.preview(parsed, start, p["count"])

    parsed, times = await offload.run(compute)
    return json_reply(views.preview(parsed, times))


async def healthz(call: Call) -> web.StreamResponse:
    return json_reply({"status": "ok"})


async def readyz(call: Call) -> web.StreamResponse:
    """Ready: not draining, wake-ups arrive, the database answers, and its schema is this
    version's."""
    if not call.deps.ready():
        return json_reply({"status": "draining"}, status=503)
    # The listener's self-check (store/listen.py) publishes its result in this gauge.
    if call.deps.metrics.registry.get_sample_value("promptsched_listener_healthy") == 0:
        return json_reply({"status": "unavailable", "error": LISTENER_DOWN}, status=503)
    try:
        with anyio.fail_after(READY_TIMEOUT):
            async with call.deps.pool.acquire() as conn:
                await lookups.check_schema(conn)
    except SchemaMismatch as exc:  # our own words: which version, and the command that fixes it
        return json_reply({"status": "unavailable", "error": str(exc)}, status=503)
    except Exception as exc:  # any failure to reach a current schema means "not ready"
        # The cause (addresses, driver messages) goes to the log, not to an unauthenticated
        # caller.
        log.warning("api.not_ready", error=repr(exc))
        reason = (
            f"the database did not answer within {READY_TIMEOUT}s"
            if isinstance(exc, TimeoutError)
            else "the database is unreachable"
        )
        return json_reply({"status": "unavailable", "error": reason}, status=503)
    return json_reply({"status": "ready"})


async def metrics(call: Call) -> web.StreamResponse:
    body = generate_latest(call.deps.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(call: Call) -> web.StreamResponse:
    return json_reply(call.deps.document)


_STATUS = Reply("status", "Status")

OPERATIONS = (
    Operation(
        "GET", "/v1/preview", preview, "preview", "Preview the next fire times", "meta",
        {"200": Reply("the next fire times, in UTC and local time", "Preview")},
        params=(
            Param("expression", "query", {"type": "string", "minLength": 1, "maxLength": 2000},
                  required=True,
                  description="cron, @macro, RRULE, 'every 15m' or 'at ISO' (kind detected)"),
            Param("kind", "query", {"type": "string", "enum": list(spec.KINDS)},
                  description="read the expression as this kind instead of detecting it"),
            Param("timezone", "query", {"type": "string", "maxLength": 100, "default": "UTC"}),
            Param("count", "query", {"type": "integer", "minimum": 1, "maximum": MAX_PREVIEW,
                                     "default": 5}),
            Param("from", "query", {**schemas.TIME, "maxLength": 64},
                  description="start after this instant (default: now)"),
            Param("dst_gap", "query", {"type": "string", "enum": ["shift", "skip"],
                                       "default": "shift"}),
            Param("dst_fold", "query", {"type": "string", "enum": ["first", "both"],
                                        "default": "first"}),
        ),
    ),
    Operation("GET", "/healthz", healthz, "healthz", "The process is alive", "meta",
              {"200": _STATUS}, auth=False),
    Operation("GET", "/readyz", readyz, "readyz",
              "Ready: database reachable, migrations applied, not draining", "meta",
              {"200": _STATUS, "503": Reply("not ready, and why", "Status")}, auth=False),
    Operation("GET", "/metrics", metrics, "metrics", "Prometheus metrics", "meta",
              {"200": Reply("Prometheus text exposition", "Text", media="text/plain")},
              auth=False),
    Operation("GET", "/v1/openapi.json", openapi, "openapi", "This OpenAPI document", "meta",
              {"200": Reply("the OpenAPI 3.1 document", "Document")}, auth=False),
)  # fmt: skip
