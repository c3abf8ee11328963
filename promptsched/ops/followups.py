"""Follow-ups (docs/followups.md): keyed one-shots an application places at its own event,
created idempotently by key, cancelled by key, re-checked while a check asks for it. Shared by
the API, the CLI and the console; every error names its field."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from promptsched import netguard
from promptsched.clock import Clock
from promptsched.domain import FollowupState, RunStatus, ScheduleInput
from promptsched.durations import format_duration, parse_duration
from promptsched.errors import NotFound, StateConflict, ValidationError
from promptsched.executors import template
from promptsched.human import text, times
from promptsched.ops import inputs, notify_targets, validate, views
from promptsched.ops import schedules as schedule_ops
from promptsched.store import queries
from promptsched.store.pool import Conn
from promptsched.tools.base import Catalog

FIELDS = ("key", "in", "at", "prompt", "provider", "model", "params", "vars", "max_checks",
          "horizon", "notify", "escalate", "resolution", "name", "timeout",
          "max_attempts", "give_up_after", "fallback")  # fmt: skip
KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_TAG = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
MAX_VARS_BYTES = 8192
MAX_DELAY = timedelta(days=366)
DEFAULT_MAX_CHECKS = 10
DEFAULT_HORIZON = timedelta(days=30)
_SECOND = timedelta(seconds=1)
MAX_ESCALATIONS = 10
STATES = tuple(state.value for state in FollowupState)


@dataclass(frozen=True, slots=True)
class Followup:
    """A checked create request: the schedule it becomes and what only follow-ups have."""

    key: str
    schedule: ScheduleInput
    due_at: datetime
    max_checks: int
    horizon: datetime
    escalate: list[dict[str, Any]]
    # every check's instant is rounded up to a multiple of it: the first here, the next ones
    # by followup_record (0015_followup_recheck_resolution.sql)
    resolution: timedelta | None


def check_key(key: object, field: str = "key") -> str:
    if not isinstance(key, str) or KEY.match(key) is None:
        raise ValidationError(
            field, "must be 1 to 200 letters, digits or . _ : @ - (starting with a letter or "
            "digit), e.g. order-4711-unshipped"
        )  # fmt: skip
    return key


def check_vars(raw: object, prompt: str) -> dict[str, Any]:
    """``vars``: an object of scalar values, named as template variables, small, and giving
    every variable the prompt uses beyond the built-in ones."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValidationError("vars", "must be an object of template variables, e.g. "
                              '{"order_id": "4711"}')  # fmt: skip
    size = len(json.dumps(raw, ensure_ascii=False).encode())
    if size > MAX_VARS_BYTES:
        raise ValidationError("vars", f"is too large ({size} bytes as JSON, at most "
                              f"{MAX_VARS_BYTES})")  # fmt: skip
    for name, value in raw.items():
        if _VAR.match(name) is None:
            raise ValidationError(f"vars.{name}", "is not a variable name (letters, digits, _)")
        if name in template.VARIABLES:
            raise ValidationError(f"vars.{name}", "is a built-in variable; choose another name")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            kind = "an object" if isinstance(value, Mapping) else type(value).__name__
            raise ValidationError(f"vars.{name}", f"must be a string, number or boolean, "
                                  f"got {kind}")  # fmt: skip
    for name in sorted(set(_TAG.findall(prompt)) - set(template.VARIABLES) - set(raw)):
        raise ValidationError(f"vars.{name}", f"is used by the prompt ({{{{ {name} }}}}) but "
                              "not given")  # fmt: skip
    template.validate(prompt, field="prompt", extra=frozenset(raw))
    return dict(raw)


def _rounded(instant: datetime, resolution: timedelta | None) -> datetime:
    """``instant`` rounded up to the next multiple of ``resolution`` (from the Unix epoch), or
    of a second without one: the first check is an ``at`` schedule, which keeps whole seconds,
    and a truncated ``in: 1s`` could be past when the schedule is made.
    The first check's; followup_record rounds every next check the same way."""
    step = (resolution or _SECOND).total_seconds()
    seconds = instant.timestamp()
    steps = -(-seconds // step)  # ceiling
    return datetime.fromtimestamp(steps * step, UTC)


def _due(raw: Mapping[str, Any], now: datetime) -> datetime:
    given = [name for name in ("in", "at") if raw.get(name) is not None]
    if len(given) != 1:
        raise ValidationError("in", "give exactly one of in (a delay such as 24h) or at "
                              "(an ISO-8601 instant with its offset)")  # fmt: skip
    if given == ["in"]:
        text = raw["in"]
        if isinstance(text, int | float) and not isinstance(text, bool):
            text = str(text)
        if not isinstance(text, str):
            raise ValidationError("in", "must be a duration such as 30s, 15m, 24h")
        delay = parse_duration(text, field="in")
        if not timedelta(seconds=1) <= delay <= MAX_DELAY:
            raise ValidationError("in", "must be between 1s and 366d")
        return now + delay
    if not isinstance(raw["at"], str):
        raise ValidationError("at", "must be an ISO-8601 instant with its offset")
    due = validate.instant(raw["at"], "at")
    if due <= now:
        raise ValidationError("at", f"is not in the future (now is {now.isoformat()})")
    if due > now + MAX_DELAY:
        raise ValidationError("at", "must be within 366 days")
    return due


def _horizon(raw: Mapping[str, Any], due: datetime) -> datetime:
    value = raw.get("horizon")
    if value is None:
        return due + DEFAULT_HORIZON
    if isinstance(value, str) and "T" in value:
        horizon = validate.instant(value, "horizon")
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        horizon = due + parse_duration(str(value), field="horizon")
    else:
        raise ValidationError("horizon", "must be a duration after the first check (7d) or an "
                              "ISO-8601 instant")  # fmt: skip
    if horizon < due:
        raise ValidationError("horizon", "ends before the first check")
    return horizon


def _escalate(raw: object, max_checks: int, allow: netguard.Allowlist) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_ESCALATIONS:
        raise ValidationError("escalate", f"must be a list of at most {MAX_ESCALATIONS} steps "
                              '{"after_checks": N, "notify": {...}}')  # fmt: skip
    steps = []
    for index, step in enumerate(raw):
        where = f"escalate[{index}]"
        if not isinstance(step, Mapping) or set(step) - {"after_checks", "notify"}:
            raise ValidationError(where, 'must be {"after_checks": N, "notify": {...}}')
        after = step.get("after_checks")
        if isinstance(after, bool) or not isinstance(after, int) or not 1 <= after < max_checks:
            raise ValidationError(f"{where}.after_checks",
                                  f"must be a whole number from 1 to {max_checks - 1} "
                                  "(below max_checks)")  # fmt: skip
        try:
            notify = notify_targets.validate_targets(step.get("notify"), allow=allow)
        except ValidationError as exc:
            raise ValidationError(f"{where}.{exc.field}", exc.message) from None
        if not notify or not any(k in notify for k in ("email", "webhook", *notify_targets.CHATS)):
            raise ValidationError(f"{where}.notify", "names no target")
        steps.append({"after_checks": after, "notify": notify})
    return steps


def check(
    raw: Mapping[str, Any],
    now: datetime,
    *,
    providers: Collection[str],
    provider_kinds: Mapping[str, str] | None = None,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
    tools: Catalog | None = None,
) -> Followup:
    """A create request checked into a Followup, or the first bad field named."""
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ValidationError(unknown[0], "is not a field of a follow-up")
    key = check_key(raw.get("key"))
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValidationError("prompt", "is required")
    variables = check_vars(raw.get("vars"), prompt)
    resolution = None
    if raw.get("resolution") is not None:
        resolution = parse_duration(str(raw["resolution"]), field="resolution")
        if not timedelta(seconds=1) <= resolution <= timedelta(days=1):
            raise ValidationError("resolution", "must be between 1s and 1d")
    due = _rounded(_due(raw, now), resolution)
    max_checks = raw.get("max_checks", DEFAULT_MAX_CHECKS)
    if (
        isinstance(max_checks, bool)
        or not isinstance(max_checks, int)
        or not 1 <= max_checks <= 1000
    ):
        raise ValidationError("max_checks", "must be a whole number from 1 to 1000")
    horizon = _horizon(raw, due)
    escalate = _escalate(raw.get("escalate"), max_checks, webhook_allow)
    schedule_raw = {
        "name": raw.get("name") or key,
        "at": due.astimezone(UTC).isoformat(),
        "timezone": "UTC",
        "prompt": prompt,
        "provider": raw.get("provider", "echo"),
        "model": raw.get("model"),
        "params": raw.get("params"),
        "notify": raw.get("notify"),
        "timeout": raw.get("timeout"),
        "max_attempts": raw.get("max_attempts", 3),
        "give_up_after": raw.get("give_up_after"),
        "fallback": raw.get("fallback"),
        # A check found late (the service was down at its time) still runs, once.
        "misfire": "run_once",
        "misfire_grace": "366d",
    }
    values = inputs.validate(
        schedule_raw, providers=providers, provider_kinds=provider_kinds,
        webhook_allow=webhook_allow, tools=tools, template_vars=frozenset(variables),
    )  # fmt: skip
    values = ScheduleInput(**{**_fields(values), "vars": variables, "followup_key": key})
    return Followup(key, values, due, max_checks, horizon, escalate, resolution)


def _fields(values: ScheduleInput) -> dict[str, Any]:
    return {name: getattr(values, name) for name in ScheduleInput.__dataclass_fields__}


def _differences(stored: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(stored) | set(given) if stored.get(k) != given.get(k))


async def create(
    conn: Conn,
    clock: Clock,
    raw: Mapping[str, Any],
    *,
    owner: str,
    actor: str,
    providers: Collection[str],
    provider_kinds: Mapping[str, str] | None = None,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
    tools: Catalog | None = None,
) -> tuple[bool, dict[str, Any]]:
    """(created, the follow-up): the same key again with the same body is the stored one
    (created False); a different body under it is a StateConflict naming what differs."""
    key = check_key(raw.get("key"))
    request = dict(raw)
    existing = await queries.followup_get(conn, owner, key)
    if existing is not None:
        return False, await _same_or_conflict(conn, existing, request)
    now = await schedule_ops.db_now(conn, clock)
    followup = check(raw, now, providers=providers, provider_kinds=provider_kinds,
                     webhook_allow=webhook_allow, tools=tools)  # fmt: skip
    try:
        async with conn.transaction():
            row = await schedule_ops.create_schedule(
                conn, clock, followup.schedule, owner=owner, actor=actor
            )
            await queries.followup_insert(
                conn, row.id, owner=owner, key=key, request=request, due_at=followup.due_at,
                max_checks=followup.max_checks, horizon=followup.horizon,
                escalate=followup.escalate, resolution=followup.resolution,
            )  # fmt: skip
    except asyncpg.UniqueViolationError:  # created meanwhile by a concurrent request
        existing = await queries.followup_get(conn, owner, key)
        assert existing is not None
        return False, await _same_or_conflict(conn, existing, request)
    found = await queries.followup_get(conn, owner, key)
    assert found is not None
    return True, await show_record(conn, found)


async def _same_or_conflict(
    conn: Conn, existing: asyncpg.Record, request: Mapping[str, Any]
) -> dict[str, Any]:
    differ = _differences(existing["request"], request)
    if differ:
        raise StateConflict(
            f"follow-up {existing['key']!r} exists with a different body: "
            f"{', '.join(differ)} differ{'s' if len(differ) == 1 else ''}"
        )
    return await show_record(conn, existing)


async def show(db: queries.DB, owner: str, key: str) -> dict[str, Any]:
    found = await queries.followup_get(db, owner, check_key(key))
    if found is None:
        raise NotFound("follow-up", key)
    return await show_record(db, found)


async def runs(
    db: queries.DB, owner: str, key: str, status: str | None, *, before_id: int | None, limit: int
) -> list[dict[str, Any]]:
    """A page of the follow-up's runs (its checks, with their retries' attempts counted),
    newest first, as ``runs list`` shows a schedule's; NotFound unless the key is the owner's."""
    found = await queries.followup_get(db, owner, check_key(key))
    if found is None:
        raise NotFound("follow-up", key)
    rows = await queries.run_list(db, schedule_id=found["schedule_id"], status=status,
                                  owner=owner, before_id=before_id, limit=limit)  # fmt: skip
    return [views.run(row) for row in rows]


REASONS = {
    "max_checks": "it reached its max_checks ({max_checks}) still asking to be checked again",
    "horizon": "its next check ({next_at}) was beyond the horizon ({horizon})",
    "past": "its next check ({next_at}) was in the past",
    "invalid": "its answer asked for a recheck that could not be read",
    "failed": "the check's run died after its attempts",
    "cancelled": "the check's run was cancelled",
    "skipped": "the check's run was skipped",
}


def _at(value: datetime) -> str:
    return times.local(value, "UTC")


def explain(found: Mapping[str, Any], checks: list[Mapping[str, Any]], runs: list[Any]) -> str:
    """Why the follow-up is where it is, in one sentence."""
    last = checks[-1] if checks else None
    state = found["state"]
    done = text.plural(found["checks"], "check")
    if state == FollowupState.CANCELLED:
        return (f"Cancelled by {found['cancelled_by']} at {_at(found['cancelled_at'])}, "
                f"after {done}; no further check starts.")  # fmt: skip
    if state == FollowupState.DONE and last is not None:
        return (f"Done: check {last['number']} answered without asking to be checked again "
                f"(run #{last['run_id']}).")  # fmt: skip
    if state == FollowupState.ENDED and last is not None:
        reason = REASONS.get(found["ended_reason"] or "", str(found["ended_reason"])).format(
            max_checks=found["max_checks"], horizon=_at(found["horizon"]),
            next_at=_at(last["next_at"]) if last["next_at"] else "-",
        )  # fmt: skip
        return f"Ended after check {last['number']}: {reason}."
    unfinished = [r for r in runs if r["status"] in (RunStatus.PENDING, RunStatus.RUNNING)]
    if unfinished:
        run = unfinished[-1]
        when = _at(max(run["available_at"], run["slot"]))
        what = "running" if run["status"] == RunStatus.RUNNING else f"due at {when}"
        return (f"Active: check {found['checks'] + 1} of at most {found['max_checks']} is "
                f"{what} (run #{run['id']}).")  # fmt: skip
    return f"Active: the first check is due at {_at(found['due_at'])}; no check has run yet."


async def show_record(db: queries.DB, found: asyncpg.Record) -> dict[str, Any]:
    """A follow-up as the API shows it: its settings, state, checks and runs."""
    checks = await queries.followup_checks(db, found["schedule_id"])
    runs = await queries.run_list(db, schedule_id=found["schedule_id"], status=None,
                                  owner=None, before_id=None, limit=200)  # fmt: skip
    runs = list(reversed(runs))
    request = found["request"]
    return {
        "id": found["schedule_id"],  # a follow-up's id is its schedule's
        "key": found["key"],
        "schedule_id": found["schedule_id"],
        "owner": found["owner"],
        "state": found["state"],
        "ended_reason": found["ended_reason"],
        "due_at": found["due_at"].isoformat(),
        "max_checks": found["max_checks"],
        "horizon": found["horizon"].isoformat(),
        "resolution": format_duration(found["resolution"]) if found["resolution"] else None,
        "checks_done": found["checks"],
        "vars": found["vars"] or {},
        "prompt": found["prompt"],
        "provider": found["provider"],
        "notify": notify_targets.public(found["notify"] or {}),
        "escalate": [
            {"after_checks": s["after_checks"], "notify": notify_targets.public(s["notify"])}
            for s in found["escalate"]
        ],
        "cancelled_by": found["cancelled_by"],
        "cancelled_at": found["cancelled_at"].isoformat() if found["cancelled_at"] else None,
        "created_at": found["created_at"].isoformat(),
        "checks": [
            {
                key: (value.isoformat() if isinstance(value, datetime) else value)
                for key, value in dict(c).items()
                if key != "schedule_id"
            }
            for c in checks
        ],  # fmt: skip
        "runs": [views.run_json(r) for r in runs],
        "explanation": explain(dict(found), [dict(c) for c in checks], runs),
        "request": {k: v for k, v in request.items() if k not in ("notify", "escalate")},
    }


async def cancel(conn: Conn, owner: str, key: str, *, actor: str, clock: Clock) -> None:
    """Cancels the follow-up: no further check starts, a pending one is cancelled and a
    running one is asked to stop (the run cancel path). Repeating it changes nothing."""
    async with conn.transaction():
        found = await queries.followup_lock(conn, owner, check_key(key))
        if found is None:
            raise NotFound("follow-up", key)
        if found["state"] == FollowupState.CANCELLED:
            return
        await queries.followup_cancel(conn, found["schedule_id"], actor, clock.sql_now())


def summary(found: asyncpg.Record) -> dict[str, Any]:
    """A follow-up in a list: its key, state and where its checks stand."""
    return {
        "id": found["schedule_id"],
        "key": found["key"],
        "schedule_id": found["schedule_id"],
        "owner": found["owner"],
        "state": found["state"],
        "ended_reason": found["ended_reason"],
        "due_at": found["due_at"].isoformat(),
        "checks_done": found["checks"],
        "max_checks": found["max_checks"],
        "created_at": found["created_at"].isoformat(),
    }


async def list_(
    db: queries.DB, owner: str | None, state: str | None, *, before_id: int | None, limit: int
) -> list[dict[str, Any]]:
    rows = await queries.followup_list(db, owner, state, before_id, limit)
    return [summary(row) for row in rows]
