"""The JSON schemas of the API: the OpenAPI components, which ``validate`` also checks every
request body and parameter against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptsched import budgets
from promptsched.domain import OutboxEvent, OutboxStatus, RunOrigin, RunStatus
from promptsched.ops import inputs
from promptsched.schedule import overlap

MAX_PAGE = 200
EMPTY = "Empty"  # the body of an operation that takes no fields
RUN_STATUSES = tuple(status.value for status in RunStatus)
ORIGINS = tuple(origin.value for origin in RunOrigin)

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return {**schema, "type": [*kinds, "null"]}


def _obj(props: Mapping[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    return {
        "type": "object",
        "properties": dict(props),
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


TIME: Schema = {"type": "string", "format": "date-time"}
ID: Schema = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
DURATION: Schema = {
    "type": ["string", "number", "null"],
    "maxLength": 40,
    "minimum": 0,
    "description": "500ms, 30s, 5m, 1h, 1d (several may be joined: 1h30m); a number is seconds",
}
_EXPR: Schema = {"type": ["string", "null"], "maxLength": 2000}

SCHEDULE_FIELDS: dict[str, Schema] = {
    "name": {"type": "string", "minLength": 1, "maxLength": inputs.MAX_NAME},
    "prompt": {"type": "string", "minLength": 1, "maxLength": inputs.MAX_PROMPT},
    "cron": {**_EXPR, "description": "5-field cron, 6-field with seconds FIRST, or @hourly"},
    "rrule": {**_EXPR, "description": "RFC 5545 RRULE, optionally with a DTSTART line"},
    "at": {**_EXPR, "description": "one-shot local ISO date-time (or with a UTC offset)"},
    "every": {**_EXPR, "description": "an interval such as 15m, optionally 'from ISO'"},
    "kind": {"type": "string", "enum": list(inputs.KINDS)},
    "expression": {**_EXPR, "description": "with kind: the expression of that kind"},
    "timezone": {"type": ["string", "null"], "maxLength": 100, "description": "IANA zone"},
    "provider": {"type": "string", "maxLength": 100},
    "model": {"type": ["string", "null"], "maxLength": 200},
    "params": {"type": ["object", "null"], "description": "provider parameters"},
    "misfire": {"type": "string", "enum": list(inputs.MISFIRE_POLICIES)},
    "misfire_cap": {"type": "integer", "minimum": 1, "maximum": 10_000},
    "misfire_grace": DURATION,
    "catchup_window": DURATION,
    "overlap": {"type": "string", "enum": list(overlap.POLICIES)},
    "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
    "timeout": DURATION,
    "jitter": DURATION,
    "dst_gap": {"type": "string", "enum": ["shift", "skip"]},
    "dst_fold": {"type": "string", "enum": ["first", "both"]},
    "pause_after_failures": {"type": ["integer", "null"], "minimum": 1, "maximum": 1000},
    "budget": {
        "type": ["object", "null"],
        "description": "limits on this schedule's spend, each optional: tokens_per_day, "
        "cost_per_day, tokens_per_month, cost_per_month (UTC day and month; cost in the "
        "price table's unit); null or {} for none",
    },
    "output_schema": {
        "type": ["object", "null"],
        "description": "the JSON Schema every answer must match (an object at its root; at "
        "most 16,384 bytes and 24 levels): openai, anthropic and gemini providers are asked "
        "for it as structured output, the webhook provider is sent it, and an answer that does not "
        "match is asked again once, then the run is dead (docs/monitors.md); null for none",
    },
    "give_up_after": {
        **DURATION,
        "description": "how long a run may keep being throttled (429, 503 with Retry-After) "
        "before it ends dead, counted from its first attempt; default 1h (docs/providers.md)",
    },
    "fallback": {
        "type": ["array", "null"],
        "maxItems": 5,
        "items": {"type": "string", "maxLength": 300},
        "description": "providers to try next, in order, after a retryable failure or "
        "throttling: NAME or NAME:MODEL (docs/providers.md); [] or null for none",
    },
    "notify_when": {
        "type": ["string", "null"],
        "maxLength": 500,
        "description": "when a success notifies: always (default), changed, changed /pointer, "
        "/pointer (truthy), /pointer == JSON, /pointer != JSON (docs/monitors.md)",
    },
}
if "notify" in inputs.EDITABLE:  # the notification targets, once the service accepts them
    SCHEDULE_FIELDS["notify"] = {
        "type": ["object", "null"],
        "description": "targets: email, webhook, slack, discord, ntfy; on_success, on_failure",
    }

_SCHEDULE_OUT: dict[str, Schema] = {
    "id": ID,
    "owner": {"type": "string"},
    "name": {"type": "string"},
    "kind": {"type": "string", "enum": list(inputs.KINDS)},
    "expression": {"type": "string"},
    "timezone": {"type": "string"},
    "dst_gap": {"type": "string"},
    "dst_fold": {"type": "string"},
    "prompt": {"type": "string"},
    "provider": {"type": "string"},
    "model": {"type": ["string", "null"]},
    "params": {"type": "object"},
    "misfire": {"type": "string"},
    "misfire_cap": {"type": "integer"},
    "misfire_grace": {"type": "string"},
    "catchup_window": {"type": ["string", "null"]},
    "overlap": {"type": "string"},
    "max_attempts": {"type": "integer"},
    "timeout": {"type": "string"},
    "jitter": {"type": ["string", "null"]},
    "enabled": {"type": "boolean"},
    "paused_until": nullable(TIME),
    "pause_reason": {"type": ["string", "null"]},
    "pause_after_failures": {"type": ["integer", "null"]},
    "budget": {"type": ["object", "null"], "description": "the schedule's spend limits"},
    "vars": {"type": ["object", "null"], "description": "a follow-up's template variables"},
    "followup_key": {"type": ["string", "null"], "description": "a follow-up's key"},
    "output_schema": {"type": ["object", "null"], "description": "the answers' JSON Schema"},
    "notify_when": {"type": "string", "description": "when a success notifies"},
    "give_up_after": {"type": "string", "description": "how long a run may stay throttled"},
    "fallback": {"type": "array", "items": {"type": "string"}, "description": "NAME[:MODEL]"},
    "next_fire_at": nullable(TIME),
    "version": {"type": "integer"},
    "created_at": TIME,
    "updated_at": TIME,
}
SCHEDULE_OUT_FIELDS = tuple(_SCHEDULE_OUT)
_SCHEDULE_EXTRA: dict[str, Schema] = {
    "notify": {
        "type": "object",
        "description": "targets; the webhook secret and chat URLs are never shown again",
    },
    "next_fire_times": {"type": "array", "items": TIME, "description": "the next 5 slots"},
    "warnings": {
        "type": "array",
        "items": {"type": "string"},
        "description": "create and update only, when there are any: what will not work as "
        "the schedule asks though it is valid (its emails when no replica can send mail, a "
        "cost limit when no price makes a cost known)",
    },
    "spend": {
        "type": "object",
        "description": "GET /v1/schedules/{id} only: tokens and cost of its runs in the "
        "current UTC day and month (by slot), as {day: {tokens, cost}, month: {...}}, and "
        "budget: each limit of the schedule's budget against it, as [{limit, allowed, "
        "spent, reached}]",
    },
}

_RUN: dict[str, Schema] = {
    "id": ID,
    "schedule_id": ID,
    "slot": TIME,
    "origin": {"type": "string", "enum": list(ORIGINS)},
    "status": {"type": "string", "enum": list(RUN_STATUSES)},
    "skip_reason": {"type": ["string", "null"]},
    "missed_slots": {"type": "integer"},
    "attempts": {"type": "integer"},
    "max_attempts": {"type": "integer"},
    "error": {"type": ["string", "null"]},
    "output": {"type": ["string", "null"]},
    "available_at": TIME,
    "created_at": TIME,
    "started_at": nullable(TIME),
    "finished_at": nullable(TIME),
    "replay_of": {"type": ["integer", "null"]},
    "throttles": {
        "type": "integer",
        "description": "attempts the provider throttled (not counted in max_attempts)",
    },
    "tokens": {"type": "integer", "description": "tokens over every attempt (usage reported)"},
    "cleaned_chars": {
        "type": ["integer", "null"],
        "description": "characters of what its attempts stored (output, error, transcript) "
        "that could not be stored as sent and were replaced with U+FFFD: a NUL, a lone "
        "surrogate, a byte that is not UTF-8 (a NaN in JSON became null); null: none",
    },
    "output_json": {
        "description": "a schedule with an output_schema: the answer's JSON, checked against it"
    },
    "notify_decision": {
        "type": ["object", "null"],
        "description": "a monitor's success (notify_when other than always): {notify, reason, "
        'when, since}: whether it notified and why, e.g. {"notify": false, "reason": '
        '"output unchanged since run 41", "since": 41}; null otherwise',
    },
    "cost": {
        "type": "number",
        "description": "what those tokens cost by the server's price table "
        "(PROMPTSCHED_PRICES, in its currency unit; 0 when the provider is not priced)",
    },
}
RUN_FIELDS = tuple(_RUN)
_ATTEMPT = _obj(
    {
        "attempt_id": {"type": "string"},
        "number": {"type": "integer"},
        "worker_id": {"type": "string"},
        "status": {"type": "string"},
        "started_at": TIME,
        "finished_at": nullable(TIME),
        "error": {"type": ["string", "null"]},
        "usage": {
            "type": ["object", "null"],
            "description": "the usage this attempt's provider reported, whatever its outcome: "
            "prompt_tokens, completion_tokens, total_tokens (an agent's summed over its "
            "steps), and cost when the provider is priced",
        },
        "transcript": {
            "type": "array",
            "items": {"type": "object"},
            "description": "an agent attempt's steps as they happened: start (the messages "
            "sent), model (a reply: content, tool_calls, usage, ms), tool_call (tool, "
            "arguments), tool_result (result truncated, error, ms); each with kind, step, "
            "tokens (the attempt's total so far), text and at. Empty for other runs.",
        },
        "provider": {"type": ["string", "null"], "description": "the provider it went to"},
        "model": {"type": ["string", "null"], "description": "the model it asked for "
                  "(null: the provider's default)"},
        "throttled": {
            "type": "boolean",
            "description": "the provider said 'not now' (429, 503 with Retry-After): not "
            "counted against max_attempts",
        },
        "wait": {"type": ["string", "null"], "description": "how long it was asked to wait"},
    },
    ("attempt_id", "number", "worker_id", "status", "started_at", "finished_at", "error",
     "usage", "transcript", "provider", "model", "throttled", "wait"),
)  # fmt: skip
_RUN_DETAIL: dict[str, Schema] = {
    **_RUN,
    "provider": {"type": "string"},
    "cancel_requested": {"type": "boolean"},
    "usage": {"type": ["object", "null"]},
    "worker_id": {"type": ["string", "null"]},
    "lease_expires_at": nullable(TIME),
    "deadline_at": nullable(TIME),
    "replayed_by": {"type": ["integer", "null"], "description": "the run that replays this one"},
    "attempt_history": {"type": "array", "items": ref("Attempt")},
    "notifications": {"type": "array", "items": ref("Notification")},
}
RUN_DETAIL_FIELDS = tuple(_RUN_DETAIL)

_NOTIFICATION: dict[str, Schema] = {
    "id": ID,
    "run_id": ID,
    "schedule_id": ID,
    "schedule_name": {"type": "string"},
    "channel": {"type": "string", "enum": ["email", "webhook"]},
    "target": {"type": ["array", "object"], "description": "never the webhook secret"},
    "event": {"type": "string", "enum": [event.value for event in OutboxEvent]},
    "status": {"type": "string", "enum": [status.value for status in OutboxStatus]},
    "attempts": {"type": "integer"},
    "max_attempts": {"type": ["integer", "null"]},
    "last_error": {"type": ["string", "null"]},
    "idempotency_key": {"type": "string"},
    "created_at": TIME,
    "available_at": TIME,
    "sent_at": nullable(TIME),
}
_NOTIFICATION_REQUIRED = (
    "id", "run_id", "schedule_id", "channel", "target", "event", "status", "attempts",
    "max_attempts", "last_error", "idempotency_key", "created_at", "available_at",
)  # fmt: skip

_CHANGE = _obj(
    {
        "id": ID,
        "schedule_id": ID,
        "owner": {"type": "string"},
        "actor": {"type": "string"},
        "action": {"type": "string"},
        "changes": {"type": "object"},
        "at": TIME,
    },
    ("id", "schedule_id", "owner", "actor", "action", "changes", "at"),
)
VERDICTS = (
    "ran", "failed", "cancelled", "skipped", "in_progress", "coalesced", "paused",
    "not_a_fire_time", "before_created", "scheduled", "due", "missed", "purged",
)  # fmt: skip
_EXPLANATION = _obj(
    {
        "schedule_id": ID,
        "at": TIME,
        "verdict": {"type": "string", "enum": list(VERDICTS)},
        "message": {"type": "string"},
        "fire_time": {"type": "boolean", "description": "whether `at` is a slot of the schedule"},
        "previous_fire_time": nullable(TIME),
        "next_fire_time": nullable(TIME),
        "expression": _obj(
            {k: {"type": "string"} for k in ("kind", "expression", "timezone")},
            ("kind", "expression", "timezone"),
            description="the expression in force at `at` (edits after it undone)",
        ),
        "runs": {"type": "array", "items": ref("Run")},
        "pause": {"oneOf": [{"type": "null"}, ref("Change")]},
    },
    ("schedule_id", "at", "verdict", "message", "fire_time", "previous_fire_time",
     "next_fire_time", "expression", "runs", "pause"),
)  # fmt: skip


def _page(item: str) -> Schema:
    return _obj(
        {
            "items": {"type": "array", "items": ref(item)},
            "next_cursor": {"type": ["string", "null"]},
        },
        ("items", "next_cursor"),
    )


COMPONENTS: dict[str, Schema] = {
    "Error": _obj(
        {
            "error": _obj(
                {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "field": {"type": ["string", "null"]},
                    "request_id": {"type": "string"},
                },
                ("code", "message", "field", "request_id"),
            )
        },
        ("error",),
    ),
    "ScheduleCreate": _obj(
        {**SCHEDULE_FIELDS, "enabled": {"type": "boolean"}},
        ("name", "prompt"),
        description="exactly one of cron, rrule, at, every (or kind + expression)",
    ),
    "SchedulePatch": _obj(
        {**SCHEDULE_FIELDS, "version": {**ID, "description": "the version you read (or If-Match)"}}
    ),
    "Schedule": _obj({**_SCHEDULE_OUT, **_SCHEDULE_EXTRA}, SCHEDULE_OUT_FIELDS),
    "SchedulePage": _page("Schedule"),
    EMPTY: _obj({}, description="no fields: send no body, or {}"),
    "Pause": _obj(
        {"until": nullable(TIME), "reason": {"type": ["string", "null"], "maxLength": 500}}
    ),
    "Backfill": _obj({"start": TIME, "end": TIME}, ("start", "end")),
    "BackfillResult": _obj(
        {
            "created": {"type": "integer"},
            "runs": {
                "type": "array",
                "items": _obj({"id": ID, "slot": TIME}, ("id", "slot")),
            },
        },
        ("created", "runs"),
    ),
    "Run": _obj(_RUN, RUN_FIELDS),
    "RunDetail": _obj(_RUN_DETAIL, RUN_DETAIL_FIELDS),
    "RunDiff": _obj(
        {
            "schedule_id": ID,
            "a": ID,
            "b": ID,
            "kind": {"type": "string", "enum": ["json", "text"]},
            "changed": {"type": "boolean"},
            "paths": {
                "type": "array",
                "items": {"type": "object"},
                "description": "kind json: {path, old, new} per changed JSON Pointer (old "
                "absent when added, new absent when removed)",
            },
            "diff": {
                "type": "array",
                "items": {"type": "string"},
                "description": "kind text: a unified diff by line, empty when the texts are "
                "equal after whitespace normalisation",
            },
        },
        ("schedule_id", "a", "b", "kind", "changed"),
    ),
    "RunPage": _page("Run"),
    "RunOutput": {
        "type": "string",
        "description": "a run's output as the provider answered it (text/plain, UTF-8)",
    },
    "Attempt": _ATTEMPT,
    "Change": _CHANGE,
    "Notification": _obj(_NOTIFICATION, _NOTIFICATION_REQUIRED),
    "NotificationPage": _page("Notification"),
    "ChangePage": _page("Change"),
    "Explanation": _EXPLANATION,
    "Preview": _obj(
        {
            "kind": {"type": "string"},
            "expression": {"type": "string"},
            "timezone": {"type": "string"},
            "fire_times": {
                "type": "array",
                "items": _obj({"utc": TIME, "local": TIME}, ("utc", "local")),
            },
        },
        ("kind", "expression", "timezone", "fire_times"),
    ),
    "Budget": _obj(
        {
            key: {"type": ["integer", "null"], "minimum": 1}
            if key.startswith("tokens")
            else {"type": ["number", "null"], "exclusiveMinimum": 0}
            for key in budgets.LIMITS
        },
        description="limits, each optional: tokens or cost (in the price table's unit) per "
        "UTC day and per UTC month",
    ),
    "OwnerBudget": _obj(
        {
            "owner": {"type": "string"},
            "budget": {"type": ["object", "null"]},
            "warnings": {
                "type": "array",
                "items": {"type": "string"},
                "description": "set only, when there are any: a cost limit no price makes "
                "reachable (PROMPTSCHED_PRICES)",
            },
            "spend": {
                "type": "object",
                "description": "{day: {tokens, cost}, month: {tokens, cost}, budget: [{limit, "
                "allowed, spent, reached}]}",
            },
        },
        ("owner", "budget", "spend"),
    ),
    "FollowupCreate": _obj(
        {
            "key": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "description": "unique per owner, e.g. order-4711-unshipped",
            },
            "in": {**DURATION, "description": "the first check this long from now (24h)"},
            "at": {
                "type": ["string", "null"],
                "maxLength": 60,
                "description": "or the first check at this instant (ISO-8601 with offset)",
            },
            "prompt": SCHEDULE_FIELDS["prompt"],
            "provider": SCHEDULE_FIELDS["provider"],
            "model": SCHEDULE_FIELDS["model"],
            "params": SCHEDULE_FIELDS["params"],
            "vars": {
                "type": ["object", "null"],
                "description": "template variables: {{ name }} in the prompt",
            },
            "max_checks": {"type": "integer", "minimum": 1, "maximum": 1000},
            "horizon": {
                "type": ["string", "number", "null"],
                "maxLength": 60,
                "description": "no check after this: a duration after the first check "
                "(default 30d) or an ISO-8601 instant",
            },
            "notify": SCHEDULE_FIELDS["notify"],
            "escalate": {
                "type": ["array", "null"],
                "items": {"type": "object"},
                "description": '[{"after_checks": N, "notify": {...}}]',
            },
            "resolution": {
                **DURATION,
                "description": "round every check up to a "
                "multiple of this (15m): fire in batches at known instants",
            },
            "name": {"type": ["string", "null"], "maxLength": inputs.MAX_NAME},
            "timeout": DURATION,
            "max_attempts": SCHEDULE_FIELDS["max_attempts"],
            "give_up_after": SCHEDULE_FIELDS["give_up_after"],
            "fallback": SCHEDULE_FIELDS["fallback"],
        },
        ("key", "prompt"),
    ),
    "Followup": {
        "type": "object",
        "required": ["id", "key", "schedule_id", "state", "checks", "runs", "explanation"],
    },
    "FollowupPage": _page("FollowupSummary"),
    "FollowupSummary": {"type": "object", "required": ["id", "key", "state", "schedule_id"]},
    "Text": {"type": "string"},
    "ServerSentEvent": {
        "type": "object",
        "description": "one event of a text/event-stream: its name and its data (JSON text)",
        "properties": {
            "event": {"type": "string"},
            "data": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    },
    "Document": {"type": "object"},
    "Doctor": {
        "type": "object",
        "required": ["ok", "checks"],
        "properties": {
            "ok": {"type": "boolean"},
            "checks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "status", "message", "fix"],
                    "properties": {
                        "name": {"type": "string"},
                        "status": {"type": "string", "enum": ["ok", "warn", "fail", "skip"]},
                        "message": {"type": "string"},
                        "fix": {"type": ["string", "null"]},
                    },
                },
            },
        },
    },
    "FleetStatus": {
        "type": "object",
        "description": "the fleet at a glance: fleet {replicas, fingerprints, drift, "
        "fingerprint, versions}; replicas [{id, host, version, roles, slots, in_flight, "
        "started_at, uptime_seconds, seen_at, seen_seconds_ago, alive, stopped_at, leads, "
        "fingerprint, drift, differs}]; providers [{name, kind, fleet_wide, max_concurrency, "
        "running, admitted_now, breaker, allowed_concurrency, rate_tokens, llm_tokens, "
        "paced_for_seconds, ready, waiting, scheduled, oldest_ready_seconds, ...}]; queue "
        "{ready, waiting, scheduled, running, lease_expired, deadline_passed}; outbox "
        "{pending, sending, dead}",
        "required": ["now", "fleet", "replicas", "providers", "queue", "outbox"],
        "properties": {
            "fleet": {"type": "object", "required": ["replicas", "fingerprints", "drift"]},
            "replicas": {"type": "array", "items": {"type": "object"}},
            "providers": {"type": "array", "items": {"type": "object"}},
            "queue": {"type": "object"},
            "outbox": {"type": "object"},
        },
    },
    "Status": {
        "type": "object",
        "properties": {"status": {"type": "string"}, "error": {"type": "string"}},
        "required": ["status"],
    },
}
