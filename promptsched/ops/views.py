"""The one rendering of rows to JSON, for the API, the CLI and the console: exactly the fields
the schemas document, secrets hidden."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from promptsched.domain import Schedule
from promptsched.durations import format_duration
from promptsched.errors import ValidationError
from promptsched.ops import notify_targets, schemas
from promptsched.schedule import fire_times, spec

NEXT_FIRE_TIMES = 5
_US = timedelta(microseconds=1)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return format_duration(value)
    return value


def schedule_json(row: Schedule, *, reveal_secret: bool = False) -> dict[str, Any]:
    """A schedule for API responses and the change history. The webhook secret is never in
    it, except once, when it was just created or changed (``reveal_secret``)."""
    data = {f.name: _json_value(getattr(row, f.name)) for f in dataclass_fields(row)}
    data["misfire"] = data.pop("misfire_policy")
    data["overlap"] = data.pop("overlap_policy")
    data["notify"] = notify_targets.public(row.notify or {}, reveal_secret=reveal_secret)
    return data


def run_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        key: _json_value(row[key]) if key != "attempt_id" else str(row[key] or "") or None
        for key in row.keys()
    }


def notification_json(row: asyncpg.Record) -> dict[str, Any]:
    """A notification as the API shows it (targets never carry the webhook secret)."""
    return {
        key: row[key].isoformat() if isinstance(row[key], datetime) else row[key]
        for key in row.keys()
        if key != "woken"
    }


def schedule_spec(row: Schedule) -> spec.Spec:
    return spec.Spec(row.kind, row.expression, row.timezone, row.dst_gap, row.dst_fold)


def next_fire_times(row: Schedule, count: int = NEXT_FIRE_TIMES) -> list[datetime]:
    """The next slots from the schedule's cursor (or from the end of its pause), by the
    scheduler's own code path; none for a schedule whose fire times this version cannot
    compute (the scheduler pauses it, and its ``pause_reason`` says why)."""
    cursor = row.next_fire_at
    if cursor is None:
        return []
    if not row.enabled and row.paused_until is not None:
        # The slots inside a pause with an end are skipped: the next ones come after it.
        cursor = max(cursor, row.paused_until)
    try:
        return fire_times.preview(schedule_spec(row), cursor - _US, count)
    except ValidationError:
        return []


def webhook_secret(row: Schedule) -> str | None:
    webhook = (row.notify or {}).get("webhook")
    return webhook.get("secret") if isinstance(webhook, dict) else None


def schedule(
    row: Schedule, *, with_next: bool = False, reveal_secret: bool = False
) -> dict[str, Any]:
    data = schedule_json(row, reveal_secret=reveal_secret)  # the secret hidden
    out = {key: data.get(key) for key in schemas.SCHEDULE_OUT_FIELDS}
    if out["params"] is None:
        out["params"] = {}
    out["notify"] = data["notify"]
    if with_next:
        out["next_fire_times"] = [t.isoformat() for t in next_fire_times(row)]
    return out


def etag(row: Schedule) -> str:
    return f'"{row.version}"'


def run(row: asyncpg.Record) -> dict[str, Any]:
    data = run_json(row)
    data.setdefault("throttles", 0)  # a listing that does not read it
    return {key: data.get(key) for key in schemas.RUN_FIELDS}


def attempt(row: asyncpg.Record) -> dict[str, Any]:
    data = run_json(row)
    return {key: data.get(key) for key in schemas.COMPONENTS["Attempt"]["properties"]}


def run_detail(
    row: asyncpg.Record,
    attempts: Sequence[asyncpg.Record],
    replay: asyncpg.Record | None,
    sent: list[dict[str, Any]],
) -> dict[str, Any]:
    data = run_json(row)
    out = {key: data.get(key) for key in schemas.RUN_DETAIL_FIELDS}
    out["cancel_requested"] = bool(out["cancel_requested"])
    out["replayed_by"] = replay["id"] if replay is not None else None
    out["attempt_history"] = [attempt(a) for a in attempts]
    out["notifications"] = sent
    return out


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "(hidden)" if k == "secret" else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(item) for item in value]
    return value


def change(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": row["id"],
        "schedule_id": row["schedule_id"],
        "owner": row["owner"],
        "actor": row["actor"],
        "action": row["action"],
        "changes": _redact(row["changes"] or {}),
        "at": row["at"].isoformat(),
    }


def page(items: list[dict[str, Any]], limit: int, key: str = "id") -> dict[str, Any]:
    """A page from ``limit + 1`` fetched items: the extra one only says there is more."""
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "next_cursor": str(items[-1][key]) if more and items else None}


def backfill(runs: Sequence[asyncpg.Record]) -> dict[str, Any]:
    """What a backfill created: how many runs, and each one's id and slot."""
    created = [{"id": run["id"], "slot": run["slot"].isoformat()} for run in runs]
    return {"created": len(created), "runs": created}


def preview(parsed: spec.Spec, times: Sequence[datetime]) -> dict[str, Any]:
    """A preview of fire times, each in UTC and in the schedule's zone."""
    zone = spec.load_zone(parsed.timezone)
    return {
        "kind": parsed.kind,
        "expression": parsed.expression,
        "timezone": parsed.timezone,
        "fire_times": [
            {"utc": t.astimezone(UTC).isoformat(), "local": t.astimezone(zone).isoformat()}
            for t in times
        ],
    }
