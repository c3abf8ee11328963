"""Schedule and run operations shared by the CLI and the HTTP API: validation of user input
(every error names its field) and the writes that go with it."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from promptsched import netguard, notify_targets, offload
from promptsched.clock import Clock
from promptsched.durations import format_duration, parse_duration
from promptsched.errors import NotFound, StateConflict, ValidationError, VersionConflict
from promptsched.executors import budget, echo, openai, template
from promptsched.schedule import fire_times, overlap, spec
from promptsched.store import queries
from promptsched.store.pool import Conn
from promptsched.tools.base import Catalog

EDITABLE = frozenset({
    "name", "prompt", "timezone", "provider", "model", "params", "misfire", "misfire_cap",
    "misfire_grace", "catchup_window", "overlap", "max_attempts", "timeout", "jitter",
    "dst_gap", "dst_fold", "pause_after_failures", "cron", "rrule", "at", "every", "kind",
    "expression", "notify",
})  # fmt: skip
MAX_NAME = 200
MAX_PROMPT = 100_000
MISFIRE_POLICIES = ("run_once", "skip", "run_all")
KINDS = ("cron", "rrule", "at", "every")


@dataclass(frozen=True, slots=True)
class ScheduleInput:
    name: str
    kind: str
    expression: str
    prompt: str
    timezone: str = "UTC"
    provider: str = "echo"
    model: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    misfire: str = "run_once"
    misfire_cap: int = 100
    misfire_grace: timedelta = timedelta(seconds=60)
    catchup_window: timedelta | None = None
    overlap: str = "skip"
    max_attempts: int = 3
    timeout: timedelta = timedelta(minutes=5)
    jitter: timedelta | None = None
    dst_gap: str = "shift"
    dst_fold: str = "first"
    enabled: bool = True
    pause_after_failures: int | None = None
    notify: Mapping[str, Any] = field(default_factory=dict)

    def spec(self) -> spec.Spec:
        return spec.parse(
            self.kind, self.expression, self.timezone, dst_gap=self.dst_gap, dst_fold=self.dst_fold
        )


def _text(raw: Mapping[str, Any], key: str, *, limit: int, required: bool = True) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise ValidationError(key, "is required")
        return None
    if not isinstance(value, str):
        raise ValidationError(key, f"must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise ValidationError(key, "must not be empty")
    if len(value) > limit:
        raise ValidationError(key, f"is too long ({len(value)} characters, at most {limit})")
    if "\x00" in value:
        raise ValidationError(key, "must not contain NUL characters")
    return value


def _int(raw: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValidationError(key, "must be a whole number")
    try:
        number = int(value)
    except ValueError:
        raise ValidationError(key, f"must be a whole number, got {value!r}") from None
    if not low <= number <= high:
        raise ValidationError(key, f"must be between {low} and {high}, got {number}")
    return number


def _duration(raw: Mapping[str, Any], key: str, default: timedelta | None) -> timedelta | None:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValidationError(key, "must be a duration such as 30s, 5m, 1h")
    return parse_duration(value, field=key)


def _choice(raw: Mapping[str, Any], key: str, default: str, choices: Collection[str]) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise ValidationError(key, f"must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


def _zone_name(raw: Mapping[str, Any]) -> str:
    """The schedule's zone: UTC when absent; an empty one is an error, not UTC."""
    zone = _text(raw, "timezone", limit=100, required=False)
    return "UTC" if zone is None else zone


def _kind_and_expression(raw: Mapping[str, Any]) -> tuple[str, str]:
    given = [kind for kind in KINDS if raw.get(kind) is not None]
    if raw.get("kind") is not None or raw.get("expression") is not None:
        if given:  # never silently drop one of two expressions
            raise ValidationError(given[0], "give either kind + expression or this, not both")
        kind = _choice(raw, "kind", "cron", KINDS)
        expression = _text(raw, "expression", limit=2000)
        assert expression is not None
        return kind, expression
    if len(given) != 1:
        raise ValidationError("schedule", "give exactly one of cron, rrule, at, every")
    expression = _text(raw, given[0], limit=2000)
    assert expression is not None
    return given[0], expression


def validate(
    raw: Mapping[str, Any],
    *,
    providers: Collection[str],
    provider_kinds: Mapping[str, str] | None = None,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
    current_notify: Mapping[str, Any] | None = None,
    tools: Catalog | None = None,
) -> ScheduleInput:
    """Turn user input into a checked ScheduleInput, or raise naming the first bad field.

    ``provider_kinds`` (provider name -> kind) enables the kind-specific checks of params,
    e.g. an ``openai`` provider's generation params. ``tools`` (this server's tool catalog)
    enables the check that an agent schedule's ``params.tools`` exist and may be used.
    """
    name = _text(raw, "name", limit=MAX_NAME)
    kind, expression = _kind_and_expression(raw)
    prompt = _text(raw, "prompt", limit=MAX_PROMPT)
    assert name is not None and prompt is not None
    template.validate(prompt, field="prompt")
    provider = _choice(raw, "provider", "echo", providers)
    params = raw.get("params") or {}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise ValidationError("params", "must be an object of string keys")
    if provider == "echo" or (provider_kinds or {}).get(provider) == "echo":
        echo.validate_params(params)
    values = ScheduleInput(
        name=name.strip(),
        kind=kind,
        expression=expression,
        prompt=prompt,
        timezone=_zone_name(raw),
        provider=provider,
        model=_text(raw, "model", limit=200, required=False),
        params=dict(params),
        misfire=_choice(raw, "misfire", "run_once", MISFIRE_POLICIES),
        misfire_cap=_int(raw, "misfire_cap", 100, 1, 10_000),
        misfire_grace=_duration(raw, "misfire_grace", timedelta(seconds=60)) or timedelta(0),
        catchup_window=_duration(raw, "catchup_window", None),
        overlap=_choice(raw, "overlap", "skip", overlap.POLICIES),
        max_attempts=_int(raw, "max_attempts", 3, 1, 100),
        timeout=_duration(raw, "timeout", None)
        or (timedelta(minutes=5) if raw.get("timeout") is None else timedelta(0)),
        jitter=_duration(raw, "jitter", None),
        dst_gap=_choice(raw, "dst_gap", "shift", ("shift", "skip")),
        dst_fold=_choice(raw, "dst_fold", "first", ("first", "both")),
        enabled=bool(raw.get("enabled", True)),
        pause_after_failures=(
            None
            if raw.get("pause_after_failures") is None
            else _int(raw, "pause_after_failures", 1, 1, 1000)
        ),
        notify=notify_targets.validate_targets(
            raw.get("notify"), allow=webhook_allow, current=current_notify
        ),
    )
    if values.timeout < timedelta(seconds=1):
        raise ValidationError("timeout", "must be at least 1s")
    values.spec()  # raises naming expression / timezone
    _check_provider_params(values, provider_kinds or {}, tools)
    return values


def _check_provider_params(
    values: ScheduleInput, provider_kinds: Mapping[str, str], tools: Catalog | None
) -> None:
    """Params that would fail every attempt fail at save time instead: an ``openai``
    provider's generation params and agent params (its tools exist here and are allowed),
    and the tags of a ``system`` prompt (the worker renders it with the prompt's context)."""
    kind = provider_kinds.get(values.provider)
    if kind == "openai":
        openai.validate_params(values.params)
    if budget.is_agent_run(values.params) and kind != "webhook":  # webhook params are opaque
        if kind not in (None, "openai"):
            raise ValidationError(
                f"params.{budget.TOOLS}", "tools and agent budgets need an openai-kind provider"
            )
        budget.validate(values.params, tools)
    system = values.params.get(openai.SYSTEM_PARAM)
    if isinstance(system, str):
        template.validate(system, field=f"params.{openai.SYSTEM_PARAM}")


async def db_now(db: queries.DB, clock: Clock) -> datetime:
    return await queries.clock_now(db, clock.sql_now())


def _columns(values: ScheduleInput) -> list[Any]:
    """The editable columns, in the order schedule_insert and schedule_update take them."""
    return [
        values.name, values.kind, values.expression, values.timezone, values.dst_gap,
        values.dst_fold, values.prompt, values.provider, values.model, dict(values.params),
        values.misfire, values.misfire_cap, values.misfire_grace, values.catchup_window,
        values.overlap, values.max_attempts, values.timeout, values.jitter,
    ]  # fmt: skip


async def create_schedule(
    db: queries.DB, clock: Clock, values: ScheduleInput, *, owner: str, actor: str | None = None
) -> asyncpg.Record:
    now = await db_now(db, clock)
    # an expression that never fires (before 2200) is an error; the search runs off the loop
    first = await offload.run(lambda: spec.check_fires(values.spec(), now))
    row = await queries.schedule_insert(
        db,
        [
            owner, *_columns(values), values.enabled, first, values.pause_after_failures,
            dict(values.notify),
        ],
    )  # fmt: skip
    await queries.schedule_change_insert(
        db, row["id"], owner, actor or owner, "create", {"fields": schedule_json(row)}
    )
    await queries.schedule_notify_changed(db, row["id"])
    return row


def input_from_row(row: asyncpg.Record) -> dict[str, Any]:
    """A stored schedule as the raw input ``validate`` takes, for merging a patch into it."""
    data = schedule_json(row)
    keep = {f for f in ScheduleInput.__dataclass_fields__} - {"misfire_grace"}
    raw = {key: data[key] for key in keep if key in data and data[key] is not None}
    raw["misfire_grace"] = data["misfire_grace"]
    raw["notify"] = dict(row["notify"] or {})  # the stored targets, secret included
    return raw


async def update_schedule(
    conn: Conn,
    clock: Clock,
    schedule_id: int,
    patch: Mapping[str, Any],
    *,
    owner: str | None,
    actor: str,
    providers: Collection[str],
    provider_kinds: Mapping[str, str] | None = None,
    webhook_allow: netguard.Allowlist = netguard.NO_WEBHOOK_ALLOW,
    expected_version: int | None = None,
    tools: Catalog | None = None,
) -> asyncpg.Record:
    """Apply a partial update. A new expression or zone takes effect from the next slot: slots
    already enqueued are not enqueued again, and a slot due now is not lost."""
    async with conn.transaction():
        row = await queries.schedule_get_for_update(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        if expected_version is not None and row["version"] != expected_version:
            raise VersionConflict(row["version"])
        unknown = sorted(set(patch) - EDITABLE)
        if unknown:
            raise ValidationError(unknown[0], "is not a field that can be changed")
        merged = input_from_row(row)
        if any(kind in patch for kind in KINDS):
            merged.pop("kind", None)
            merged.pop("expression", None)
        merged.update(patch)
        values = await offload.run(
            lambda: validate(
                merged,
                providers=providers,
                provider_kinds=provider_kinds,
                webhook_allow=webhook_allow,
                current_notify=row["notify"],
                tools=tools,
            )
        )
        cursor = row["next_fire_at"]
        timing = ("kind", "expression", "timezone", "dst_gap", "dst_fold")
        if any(getattr(values, f) != row[f] for f in timing):
            now = await db_now(conn, clock)
            after = min(now, cursor) if cursor is not None else now
            since = after - timedelta(microseconds=1)
            cursor = await offload.run(lambda: spec.check_fires(values.spec(), since))
        updated = await queries.schedule_update(
            conn, schedule_id, row["version"],
            [*_columns(values), cursor, values.pause_after_failures, dict(values.notify)],
        )  # fmt: skip
        assert updated is not None  # the row is locked: its version cannot move
        before, after_json = schedule_json(row), schedule_json(updated)
        changes = {
            k: [before[k], after_json[k]]
            for k in after_json
            if k not in ("version", "updated_at") and before.get(k) != after_json[k]
        }
        await queries.schedule_change_insert(
            conn, schedule_id, row["owner"], actor, "update", changes
        )
        await queries.schedule_notify_changed(conn, schedule_id)
        return updated


async def pause_schedule(
    conn: Conn,
    schedule_id: int,
    *,
    owner: str | None,
    actor: str,
    until: datetime | None = None,
    reason: str | None = None,
) -> asyncpg.Record:
    async with conn.transaction():
        row = await queries.schedule_pause(conn, schedule_id, owner, until, reason)
        if row is None:
            raise NotFound("schedule", schedule_id)
        await queries.schedule_change_insert(
            conn, schedule_id, row["owner"], actor, "pause",
            {"until": until.isoformat() if until else None, "reason": reason},
        )  # fmt: skip
        await queries.schedule_notify_changed(conn, schedule_id)
        return row


async def resume_schedule(
    conn: Conn, schedule_id: int, *, owner: str | None, actor: str
) -> asyncpg.Record:
    """Resume; slots missed while paused meet the schedule's misfire policy on the next tick."""
    async with conn.transaction():
        row = await queries.schedule_resume(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        await queries.schedule_change_insert(conn, schedule_id, row["owner"], actor, "resume", {})
        await queries.schedule_notify_changed(conn, schedule_id)
        return row


async def trigger_schedule(
    conn: Conn, clock: Clock, schedule_id: int, *, owner: str | None, actor: str
) -> asyncpg.Record:
    """A run now, outside the cadence (origin ``manual``). A paused schedule is refused: its
    run would be skipped as ``disabled`` by the worker's claim-time check (invariant 7)."""
    async with conn.transaction():
        row = await queries.schedule_get(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        if not row["enabled"]:
            raise StateConflict(f"schedule {schedule_id} is {_paused(row)}; resume it to run it")
        run = await queries.run_insert_manual(conn, schedule_id, clock.sql_now())
        assert run is not None
        await queries.schedule_change_insert(
            conn, schedule_id, row["owner"], actor, "trigger",
            {"run_id": run["id"]},
        )  # fmt: skip
        await queries.run_notify_ready(conn, "manual")
        return run


def _paused(row: asyncpg.Record) -> str:
    until = row["paused_until"]
    reason = row["pause_reason"]
    text = f"paused until {until.isoformat()}" if until is not None else "paused"
    return f"{text} ({reason})" if reason else text


MAX_BACKFILL = 1000


async def backfill_schedule(
    conn: Conn,
    clock: Clock,
    schedule_id: int,
    start: datetime,
    end: datetime,
    *,
    owner: str | None,
    actor: str,
) -> list[asyncpg.Record]:
    """Runs for the past slots in [start, end] that have none yet (origin ``backfill``)."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValidationError("start", "start and end need a UTC offset")
    if end < start:
        raise ValidationError("end", "must not be before start")
    async with conn.transaction():
        row = await queries.schedule_get(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        now = await db_now(conn, clock)
        if end > now:
            raise ValidationError("end", "a backfill covers the past only")
        schedule_spec = spec.Spec(row["kind"], row["expression"], row["timezone"],
                                  row["dst_gap"], row["dst_fold"])  # fmt: skip
        slots = []
        for slot in fire_times.iter_after(schedule_spec, start - timedelta(microseconds=1)):
            if slot > end:
                break
            slots.append(slot)
            if len(slots) > MAX_BACKFILL:
                raise ValidationError(
                    "end", f"the range holds more than {MAX_BACKFILL} slots; split it"
                )
        created = await queries.run_insert_backfill(conn, schedule_id, slots, clock.sql_now())
        await queries.schedule_change_insert(
            conn, schedule_id, row["owner"], actor, "backfill",
            {"start": start.isoformat(), "end": end.isoformat(), "runs": len(created)},
        )  # fmt: skip
        if created:
            await queries.run_notify_ready(conn, "backfill")
        return created


async def delete_schedule(conn: Conn, schedule_id: int, *, owner: str | None, actor: str) -> None:
    async with conn.transaction():
        row = await queries.schedule_get_for_update(conn, schedule_id, owner)
        if row is None:
            raise NotFound("schedule", schedule_id)
        await queries.schedule_change_insert(
            conn, schedule_id, row["owner"], actor, "delete", {"name": row["name"]}
        )
        await queries.schedule_delete(conn, schedule_id, owner)
        await queries.schedule_notify_changed(conn, schedule_id)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return format_duration(value)
    return value


def schedule_json(row: asyncpg.Record, *, reveal_secret: bool = False) -> dict[str, Any]:
    """A schedule for API responses and the change history. The webhook secret is never in
    it, except once, when it was just created or changed (``reveal_secret``)."""
    data = {key: _json_value(row[key]) for key in row.keys()}
    data["misfire"] = data.pop("misfire_policy", None)
    data["overlap"] = data.pop("overlap_policy", None)
    if "notify" in data:
        data["notify"] = notify_targets.public(row["notify"] or {}, reveal_secret=reveal_secret)
    return data


def run_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        key: _json_value(row[key]) if key != "attempt_id" else str(row[key] or "") or None
        for key in row.keys()
    }


def preview(spec_: spec.Spec, after: datetime, count: int) -> list[datetime]:
    """The next fire times, by the very code path the scheduler uses."""
    return fire_times.preview(spec_, after, count)


async def cancel_run(
    conn: Conn, clock: Clock, run_id: int, *, owner: str | None, actor: str
) -> asyncpg.Record:
    """A pending run ends ``cancelled`` at once; a running one gets ``cancel_requested``, which
    its worker's next heartbeat turns into a cooperative stop. Cancelling a cancelled run is a
    no-op; any other finished run conflicts."""
    row = await queries.run_cancel(conn, run_id, owner, clock.sql_now(), f"cancelled by {actor}")
    if row is not None:
        return row
    current = await queries.run_get(conn, run_id, owner)
    if current is None:
        raise NotFound("run", run_id)
    if current["status"] == "cancelled":
        return current
    raise StateConflict(
        f"run {run_id} is {current['status']}: only a pending or running run can be cancelled"
    )


async def replay_run(
    conn: Conn, clock: Clock, run_id: int, *, owner: str | None, actor: str
) -> asyncpg.Record:
    """A new run (origin ``replay``, ``replay_of`` = the old id) for the slot of a dead run;
    each dead run is replayed at most once."""
    async with conn.transaction():
        row = await queries.run_insert_replay(conn, run_id, owner, clock.sql_now())
        if row is None:
            current = await queries.run_get(conn, run_id, owner)
            if current is None:
                raise NotFound("run", run_id)
            if current["status"] != "dead":
                raise StateConflict(
                    f"run {run_id} is {current['status']}: only a dead run can be replayed"
                )
            existing = await queries.run_get_replay(conn, run_id)
            again = f" as run {existing['id']}" if existing is not None else ""
            raise StateConflict(f"run {run_id} was already replayed{again}")
        await queries.run_notify_ready(conn, "replay")  # delivered at commit
        return row
