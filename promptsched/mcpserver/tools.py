"""The tools an assistant sees: each is one of the API's operations (or two), its input schema
built from that operation's own parameters and body schema, so an argument is checked exactly
as the API checks it, and a refusal comes back as a tool error naming the argument and what to
do about it. The resources: a run's output and a schedule's recent runs."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from promptsched.human import describe
from promptsched.mcpserver.gateway import OPERATIONS, Answer, Gateway, Refused
from promptsched.ops import schemas

Schema = dict[str, Any]
Shape = Callable[[Gateway, Mapping[str, Any], Answer], Awaitable[Any]]

# Arguments worded for the tool rather than the route (the route's own wording otherwise).
_SCHEDULE_ID = "the schedule's id, from create_schedule or list_schedules"
_RUN_ID = "the run's id, from list_runs or trigger_schedule"
_ARGUMENTS: dict[str, dict[str, str]] = {
    "preview_schedule": {
        "expression": "a cron line ('0 9 * * 1-5'), a macro ('@daily'), an interval "
        "('every 15m'), a one-shot ('at 2026-03-02T09:00') or an RRULE "
        "('FREQ=WEEKLY;BYDAY=MO;BYHOUR=9')",
        "timezone": "an IANA zone, e.g. Europe/Berlin (default UTC)",
        "count": "how many fire times to show (1-100, default 5)",
        "from": "show the times after this ISO-8601 instant (default now)",
    },
    "list_schedules": {"owner": "admin tokens only: another owner's schedules"},
    "show_schedule": {"id": _SCHEDULE_ID},
    "edit_schedule": {"id": _SCHEDULE_ID},
    "pause_schedule": {"id": _SCHEDULE_ID},
    "resume_schedule": {"id": _SCHEDULE_ID},
    "trigger_schedule": {"id": _SCHEDULE_ID},
    "delete_schedule": {"id": _SCHEDULE_ID},
    "show_followup": {"key": "the key it was placed under", "owner": "admin tokens only"},
    "cancel_followup": {"key": "the key it was placed under", "owner": "admin tokens only"},
    "list_followups": {"owner": "admin tokens only: another owner's follow-ups"},
    "list_runs": {"schedule_id": "only this schedule's runs"},
    "show_run": {"id": _RUN_ID},
    "diff_runs": {"id": "the older run's id", "other": "the newer run's id (same schedule)"},
}
_DROPPED = frozenset({"If-Match"})  # edit_schedule takes the version as an argument instead
PAGE = 10  # a list tool's page when no limit is given (the API's is 50: long for a context)
OUTPUT_CUT = 2000  # a listed run's output is cut here; show_run and the resource have it whole


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    operation: str  # the API operation that answers it
    title: str
    description: str
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    shape: Shape | None = None  # the answer as the tool returns it (default: the route's JSON)
    schema: Schema = field(default_factory=dict)

    def split(self, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The operation's parameters and its body. An argument that is neither goes where
        the operation will name it as unknown (its body when it has one)."""
        op = OPERATIONS[self.operation]
        names = {p.name for p in op.params} - _DROPPED
        params = {k: v for k, v in arguments.items() if k in names}
        if "limit" in names and "limit" not in params:
            params["limit"] = PAGE
        rest = {k: v for k, v in arguments.items() if k not in names}
        if op.body_schema is None:
            return {**params, **rest}, {}
        return params, rest


def input_schema(name: str, operation: str) -> Schema:
    """The operation's parameters and body fields as one JSON Schema object."""
    op = OPERATIONS[operation]
    properties: dict[str, Schema] = {}
    required: list[str] = []
    words = _ARGUMENTS.get(name, {})
    for param in op.params:
        if param.name in _DROPPED:
            continue
        schema = copy.deepcopy(param.schema)
        if param.name == "limit":
            schema["default"] = PAGE
        text = words.get(param.name) or param.description
        if text:
            schema["description"] = text
        properties[param.name] = schema
        if param.required:
            required.append(param.name)
    if op.body is not None:
        body = schemas.COMPONENTS[op.body]
        for key, schema in body.get("properties", {}).items():
            properties[key] = copy.deepcopy(schema)
            if key in words:
                properties[key]["description"] = words[key]
        required.extend(body.get("required", []))
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


# The answers, shaped where the route's JSON alone would leave the model guessing.


async def _preview(gateway: Gateway, arguments: Mapping[str, Any], answer: Answer) -> Any:
    data = dict(answer.data)
    data["in_words"] = describe.describe(data["kind"], data["expression"])
    return data


async def _placed(gateway: Gateway, arguments: Mapping[str, Any], answer: Answer) -> Any:
    placed = "created" if answer.status == 201 else "already placed with this key and body"
    return {"placed": placed, "followup": answer.data}


async def _runs(gateway: Gateway, arguments: Mapping[str, Any], answer: Answer) -> Any:
    """A page of runs, each output cut to OUTPUT_CUT characters with where the rest is."""
    items = []
    for run in answer.data["items"]:
        output = run.get("output")
        if isinstance(output, str) and len(output) > OUTPUT_CUT:
            rest = len(output) - OUTPUT_CUT
            where = f"show_run or promptsched://runs/{run['id']}/output"
            run = {**run, "output": f"{output[:OUTPUT_CUT]}... [{rest} more characters: {where}]"}
        items.append(run)
    return {**answer.data, "items": items}


async def _deleted(gateway: Gateway, arguments: Mapping[str, Any], answer: Answer) -> Any:
    return {"deleted": True, "schedule_id": arguments["id"]}


async def _cancelled(gateway: Gateway, arguments: Mapping[str, Any], answer: Answer) -> Any:
    """Cancel answers nothing; the follow-up as it now stands says what cancelling did."""
    params = {k: v for k, v in arguments.items() if k in ("key", "owner")}
    shown = await gateway.call("getFollowup", params)
    return {"cancelled": True, "followup": shown.data}


def _spec(
    name: str,
    operation: str,
    title: str,
    description: str,
    **options: Any,
) -> ToolSpec:
    return ToolSpec(
        name, operation, title, description, schema=input_schema(name, operation), **options
    )


TOOLS: tuple[ToolSpec, ...] = (
    _spec(
        "preview_schedule", "preview", "Preview a schedule expression",
        "When would this schedule fire? The expression in words and its next fire times, in "
        "UTC and in the zone; nothing is created. Use it before create_schedule to check that "
        "an expression means what you intend.\n"
        'Example: {"expression": "0 9 * * 1-5", "timezone": "Europe/Berlin", "count": 3} -> '
        '"at 09:00, Monday to Friday" and the next three weekday mornings.',
        read_only=True, idempotent=True, shape=_preview,
    ),
    _spec(
        "create_schedule", "createSchedule", "Create a recurring or one-shot schedule",
        "Schedule a prompt: it runs at each fire time on a provider and its output is kept as "
        "a run (and sent to `notify` targets). Give exactly one of cron, rrule, every, at. "
        "A monitor sets output_schema (the answer is JSON of that shape) and notify_when (when "
        "a success notifies: 'changed', '/in_stock == true', ...).\n"
        'Example: {"name": "release digest", "cron": "0 8 * * 1", "timezone": "Europe/Paris", '
        '"prompt": "Summarize last week\'s releases of example/project.", "provider": "openai", '
        '"notify": {"email": ["me@example.com"]}}\n'
        'Example (monitor): {"name": "stock", "every": "1h", "prompt": "Is the blue kettle in '
        'stock at example.com/kettle?", "output_schema": {"type": "object", "properties": '
        '{"in_stock": {"type": "boolean"}}, "required": ["in_stock"]}, '
        '"notify_when": "/in_stock == true"}\n'
        "The answer has the schedule's id and its next fire times.",
    ),
    _spec(
        "list_schedules", "listSchedules", "List your schedules",
        "Your schedules in id order, a page at a time (pass next_cursor as cursor for the "
        "next page). Filter with name (a case-insensitive substring) or enabled.\n"
        'Example: {"name": "digest", "limit": 20}',
        read_only=True, idempotent=True,
    ),
    _spec(
        "show_schedule", "getSchedule", "Show one schedule",
        "A schedule with its next five fire times, state, version and spend.\n"
        'Example: {"id": 12}',
        read_only=True, idempotent=True,
    ),
    _spec(
        "edit_schedule", "updateSchedule", "Change a schedule",
        "Change only the fields you give; a new expression or zone applies from the next slot. "
        "Pass the version you read (show_schedule) to refuse the change when someone else "
        "changed it meanwhile.\n"
        'Example: {"id": 12, "cron": "0 7 * * 1", "version": 3}\n'
        'Example: {"id": 12, "notify_when": "changed", "notify": {"email": ["me@example.com"]}}',
        idempotent=True,
    ),
    _spec(
        "pause_schedule", "pauseSchedule", "Pause a schedule",
        "No new runs until resumed, or until `until`. Slots that fall due meanwhile meet the "
        "schedule's misfire policy on resume.\n"
        'Example: {"id": 12, "until": "2026-04-01T00:00:00Z", "reason": "on holiday"}',
        idempotent=True,
    ),
    _spec(
        "resume_schedule", "resumeSchedule", "Resume a paused schedule",
        'Example: {"id": 12}', idempotent=True,
    ),
    _spec(
        "trigger_schedule", "triggerSchedule", "Run a schedule now",
        "One run now, besides its regular ones; the answer is the new run (show_run follows "
        "it to its output). A paused schedule must be resumed first.\n"
        'Example: {"id": 12}',
    ),
    _spec(
        "delete_schedule", "deleteSchedule", "Delete a schedule",
        "Deletes the schedule and its runs, for good. Prefer pause_schedule to stop it for "
        "a while.\n"
        'Example: {"id": 12}',
        destructive=True, idempotent=True, shape=_deleted,
    ),
    _spec(
        "place_followup", "createFollowup", "Place a keyed follow-up",
        "Keep a promise for later: a one-shot check that runs the prompt `in` a delay or `at` "
        "an instant, under a key you choose (e.g. the order or ticket it is about). Placing the "
        "same key with the same arguments again changes nothing and returns the same "
        "follow-up, so retrying is safe; the same key with other arguments is refused. A check "
        'may answer {"recheck_in": "6h"} to be checked again, up to max_checks and horizon.\n'
        'Example: {"key": "order-4711-unshipped", "in": "24h", "prompt": "Has order {{ order }} '
        'shipped? If not, draft an apology.", "vars": {"order": "4711"}, '
        '"notify": {"email": ["ops@example.com"]}}\n'
        'Example: {"key": "call-ada-back", "at": "2026-03-03T09:00:00+01:00", "prompt": '
        '"Remind me to call Ada back about the offer."}',
        idempotent=True, shape=_placed,
    ),
    _spec(
        "show_followup", "getFollowup", "Show a follow-up by key",
        "Where a follow-up stands (active, done, ended, cancelled, and why), every check with "
        "its decision, and its runs.\n"
        'Example: {"key": "order-4711-unshipped"}',
        read_only=True, idempotent=True,
    ),
    _spec(
        "list_followups", "listFollowups", "List your follow-ups",
        "Newest first, a page at a time; filter by state (active, done, ended, cancelled).\n"
        'Example: {"state": "active"}',
        read_only=True, idempotent=True,
    ),
    _spec(
        "cancel_followup", "cancelFollowup", "Cancel a follow-up by key",
        "No further check runs: a pending check is cancelled, a running one asked to stop. Its "
        "history stays. Cancelling again, or one that already ended, changes nothing.\n"
        'Example: {"key": "order-4711-unshipped"}',
        destructive=True, idempotent=True, shape=_cancelled,
    ),
    _spec(
        "list_runs", "listRuns", "List runs",
        "Your runs, newest first, a page at a time; filter by schedule_id and status "
        "(pending, running, succeeded, dead, cancelled, skipped). Each has its output (a long "
        f"one cut at {OUTPUT_CUT:,} characters: show_run has it whole).\n"
        'Example: {"schedule_id": 12, "status": "succeeded", "limit": 5}',
        read_only=True, idempotent=True, shape=_runs,
    ),
    _spec(
        "show_run", "getRun", "Show a run with its output",
        "A run: its status, output (and output_json for a monitor), error, skip reason and "
        "every attempt.\n"
        'Example: {"id": 812}',
        read_only=True, idempotent=True,
    ),
    _spec(
        "diff_runs", "diffRuns", "What changed between two runs",
        "Two runs of one schedule compared: the JSON paths that changed (monitors) or a "
        "line diff of the text.\n"
        'Example: {"id": 811, "other": 812}',
        read_only=True, idempotent=True,
    ),
    _spec(
        "fleet_status", "fleetStatus", "The fleet at a glance (admin tokens)",
        "Replicas, providers (breakers, room, pacing), the queue and the outbox. Only an admin "
        "token may ask.\n"
        "Example: {}",
        read_only=True, idempotent=True,
    ),
)  # fmt: skip

BY_NAME = {tool.name: tool for tool in TOOLS}

# Where a model goes next after a "not found".
_NOT_FOUND_HINT = {
    "followup": "list_followups shows the keys you placed",
    "run": "list_runs shows your runs",
}


_EXPRESSIONS = ("cron", "rrule", "every", "at")


def argument(field: str, arguments: Mapping[str, Any]) -> str:
    """The argument a refused field is: the API names a schedule's expression ``expression``
    whichever of cron, rrule, every or at carried it."""
    if field == "expression" and "expression" not in arguments:
        given = [name for name in _EXPRESSIONS if arguments.get(name) is not None]
        if len(given) == 1:
            return given[0]
    return field


def refusal_text(tool: ToolSpec, refused: Refused, arguments: Mapping[str, Any]) -> str:
    """A refusal as the model should read it: what, which argument, and what to do."""
    message = refused.message.rstrip(".")
    if refused.status in (400, 422) and refused.field:
        name = argument(refused.field, arguments)
        known = list(tool.schema["properties"])
        if name in arguments and name not in known:  # an argument the tool does not take
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            hint = f"did you mean `{close[0]}`?" if close else f"it takes {', '.join(known)}"
            return f"Unknown argument `{name}`: {tool.name} does not take it; {hint}"
        return f"Invalid argument `{name}`: {message}. Correct `{name}` and call {tool.name} again."
    if refused.status in (400, 422):
        return f"Invalid arguments: {message}. Correct them and call {tool.name} again."
    if refused.status == 401:
        return (
            f"The token was refused ({message}): it is unknown, expired or revoked. Ask the "
            "person who set up promptsched for a valid token; retrying will not help."
        )
    if refused.status == 403:
        return f"Not allowed: {message}."
    if refused.status == 404:
        kind = next((k for k in _NOT_FOUND_HINT if k in tool.name), "schedule")
        hint = _NOT_FOUND_HINT.get(kind, "list_schedules shows your schedules")
        return f"Not found: {message} (or it belongs to another owner); {hint}."
    if refused.status in (409, 412):
        where = f" (`{refused.field}`)" if refused.field else ""
        return f"Conflict{where}: {message}."
    return f"promptsched could not answer ({refused.status}): {message}."


def to_text(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, indent=1, default=str)
