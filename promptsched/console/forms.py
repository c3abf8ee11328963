"""The create/edit form (validated by ``inputs.validate``, its messages shown next to the
field they name) and the preview of the next fire times it shows: rendered by the server on
"Preview" without the script, and fetched from ``/preview`` as you type with it."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from aiohttp import web

from promptsched import budgets, domain, errors, offload
from promptsched.console import form_page, layout, notify_form, timefmt
from promptsched.console.context import Ctx, NotFoundPage, redirect
from promptsched.errors import ValidationError
from promptsched.human import describe
from promptsched.ops import fleet, inputs, lookups, validate, views
from promptsched.ops import schedules as schedule_ops
from promptsched.schedule import overlap, spec

PREVIEW_COUNT = 5
FIELDS = ("name", "kind", "expression", "timezone", "prompt", "provider", "model", "params",
          "misfire", "overlap", "max_attempts", "timeout", "misfire_grace", "misfire_cap",
          "catchup_window", "jitter", "dst_gap", "dst_fold", "pause_after_failures",
          "give_up_after", "fallback", *form_page.BUDGET_FIELDS, "notify_when",
          "output_schema")  # fmt: skip
DEFAULTS = {"kind": "auto", "timezone": "UTC", "provider": "echo", "misfire": "run_once",
            "overlap": "skip", "max_attempts": "3", "timeout": "5m", "params": "",
            "misfire_grace": "1m", "misfire_cap": "100", "dst_gap": "shift",
            "dst_fold": "first", "give_up_after": "1h", "notify_when": "always"}  # fmt: skip
CHOICES = {
    "kind": ("auto", *spec.KINDS),
    "misfire": inputs.MISFIRE_POLICIES,
    "overlap": overlap.POLICIES,
    "dst_gap": ("shift", "skip"),
    "dst_fold": ("first", "both"),
}
# Optional settings: an empty field means "none" (no catch-up window, no jitter, never pause).
_OPTIONAL = ("catchup_window", "jitter", "pause_after_failures")


def parse_expression(kind: str, expression: str, timezone: str) -> spec.Spec:
    """The schedule the form describes; kind ``auto`` detects it from the text."""
    if kind == "auto" or not kind:
        return spec.parse_line(expression, timezone or "UTC")
    return spec.parse(kind, expression, timezone or "UTC")


def preview_times(parsed: spec.Spec, now: datetime) -> list[datetime]:
    return schedule_ops.preview(parsed, now, PREVIEW_COUNT)


def _submitted(ctx: Ctx) -> dict[str, str]:
    values = {name: ctx.field(name, DEFAULTS.get(name, "")) for name in FIELDS}
    return {**values, **notify_form.submitted(ctx.field)}


def _raw(values: dict[str, str]) -> dict[str, Any]:
    """The form as the input ``inputs.validate`` (and ``update_schedule``) take."""
    validate.check_storable(values)
    parsed = parse_expression(values["kind"], values["expression"], values["timezone"])
    raw: dict[str, Any] = {
        key: values[key].strip()
        for key in ("name", "misfire", "overlap", "timeout", "provider", "misfire_grace",
                    "misfire_cap", "dst_gap", "dst_fold")
    }  # fmt: skip
    raw.update({key: values[key].strip() or None for key in _OPTIONAL})
    raw.update(
        kind=parsed.kind,
        expression=parsed.expression,
        prompt=values["prompt"],
        timezone=values["timezone"].strip() or "UTC",
        model=values["model"].strip() or None,
        max_attempts=values["max_attempts"].strip(),
        give_up_after=values["give_up_after"].strip() or None,
        # one NAME or NAME:MODEL per line (or comma-separated), in order
        fallback=[
            p.strip() for p in values["fallback"].replace(",", "\n").splitlines() if p.strip()
        ],
        params=_params(values["params"]),
        budget=budgets.parse_texts(
            {key: values[f"budget_{key}"] for key in budgets.LIMITS}, field="budget"
        ),
        notify_when=values["notify_when"].strip() or "always",
        output_schema=inputs.schema_text(values["output_schema"]),
    )
    return raw


def _params(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = validate.parse_json(text.encode("utf-8", "surrogatepass"), what="the text")
    except validate.Malformed as exc:
        raise ValidationError("params", f"must be a JSON object: {exc.message}") from None
    validate.check_storable(value, "params")  # names a NaN or an over-long number
    if not isinstance(value, dict):
        raise ValidationError("params", 'must be a JSON object, e.g. {"latency": "2s"}')
    return value


def _row_values(row: domain.Schedule) -> dict[str, str]:
    data = views.schedule_json(row)
    values = {key: str(data.get(key) or "") for key in FIELDS}
    values.update(kind=row.kind, max_attempts=str(row.max_attempts))
    values["params"] = json.dumps(data["params"]) if data["params"] else ""
    values["fallback"] = ", ".join(row.fallback)
    values.update(form_page.budget_values(row.budget))
    values["output_schema"] = json.dumps(row.output_schema, indent=2) if row.output_schema else ""
    values["notify_when"] = row.notify_when
    return {**values, **notify_form.values_of(row.notify)}


def _render(
    ctx: Ctx,
    values: dict[str, str],
    *,
    sid: int | None = None,
    version: int | None = None,
    error: ValidationError | None = None,
    notice: str | None = None,
    status: int = 200,
    stored_notify: Any = None,
) -> web.Response:
    try:
        parsed = parse_expression(values["kind"], values["expression"], values["timezone"])
        times = preview_times(parsed, ctx.now)
        words = describe.describe(parsed.kind, parsed.expression)
        preview = form_page.preview_list(times, timefmt.zone(parsed.timezone), ctx.now, words)
    except ValidationError as exc:
        preview = form_page.preview_error(exc.field, exc.message)
    if not values["expression"].strip():
        preview = form_page.preview_hint("Type a schedule to see its next fire times.")
    body = form_page.form(
        ctx, values, CHOICES, ctx.deps.providers, preview=preview, sid=sid, version=version,
        error=error, notice=notice,
        notify=notify_form.section(values, stored_notify, error),
    )  # fmt: skip
    title = "New schedule" if sid is None else f"Edit {values['name']}"
    return layout.page(ctx, title, body, status=status)


async def new_form(ctx: Ctx) -> web.StreamResponse:
    values = {name: DEFAULTS.get(name, "") for name in FIELDS}
    values.update({name: notify_form.DEFAULTS.get(name, "") for name in notify_form.FIELDS})
    return _render(ctx, values)


async def _checks(ctx: Ctx) -> dict[str, Any]:
    """Input is checked against what the running fleet published (ops/fleet.py)."""
    deps = ctx.deps
    return (await fleet.current(deps.pool, deps.clock, deps.published)).checks()


async def create(ctx: Ctx) -> web.StreamResponse:
    values = _submitted(ctx)
    if ctx.field("op") == "preview":
        return _render(ctx, values)
    try:
        raw = {**_raw(values), "notify": notify_form.notify_input(values, None)}
        checked = inputs.validate(raw, **await _checks(ctx))
        async with ctx.deps.pool.acquire() as conn, conn.transaction():
            row = await schedule_ops.create_schedule(
                conn, ctx.deps.clock, checked, owner=ctx.who.owner, actor=ctx.who.actor,
                max_schedules=ctx.deps.max_schedules,
            )  # fmt: skip
    except ValidationError as exc:
        return _render(ctx, values, error=exc, status=422)
    return _saved(ctx, values, None, row, "created")


def _saved(
    ctx: Ctx, values: dict[str, str], before: Any, row: domain.Schedule, done: str
) -> web.StreamResponse:
    """Back to the schedule; first, once, the webhook secret promptsched just generated."""
    href = f"/schedules/{row.id}?done={done}"
    secret = notify_form.new_secret(before, row.notify)
    if secret is None or values.get("notify_webhook_secret"):
        return redirect(href)
    body = notify_form.secret_page(secret, href)
    response = layout.page(ctx, "Webhook secret", body)
    response.headers["Cache-Control"] = "no-store"
    return response


async def edit_form(ctx: Ctx) -> web.StreamResponse:
    sid = ctx.path_id()
    row = await lookups.schedule(ctx.deps.pool, sid, ctx.scope)
    if row is None:
        raise NotFoundPage()
    return _render(ctx, _row_values(row), sid=sid, version=row.version, stored_notify=row.notify)


async def save(ctx: Ctx) -> web.StreamResponse:
    sid = ctx.path_id()
    values = _submitted(ctx)
    raw_version = ctx.field("version")
    version = int(raw_version) if raw_version.isascii() and raw_version.isdigit() else None
    if version is None or len(raw_version) > 9:
        raise ValidationError("version", "the form lost its version; reload it")
    deps = ctx.deps
    current = await lookups.schedule(deps.pool, sid, ctx.scope)
    if current is None:
        raise NotFoundPage()
    stored = current.notify
    if ctx.field("op") == "preview":
        return _render(ctx, values, sid=sid, version=version, stored_notify=stored)
    try:
        patch = {**_raw(values), "notify": notify_form.notify_input(values, stored)}
        async with deps.pool.acquire() as conn:
            row = await schedule_ops.update_schedule(
                conn, deps.clock, sid, patch, owner=ctx.scope, actor=ctx.who.actor,
                expected_version=version, **await _checks(ctx),
            )  # fmt: skip
    except ValidationError as exc:
        return _render(
            ctx, values, sid=sid, version=version, error=exc, status=422, stored_notify=stored
        )
    except errors.VersionConflict as exc:
        notice = f"{exc}: reload the page to edit the current version."
        return _render(
            ctx, values, sid=sid, version=version, notice=notice, status=409, stored_notify=stored
        )
    return _saved(ctx, values, stored, row, "saved")


async def schema_check(ctx: Ctx) -> web.StreamResponse:
    """The form's live check of the output schema and the notify condition, as typed: the
    save-time checks, nothing stored."""
    text = ctx.field("output_schema", "")[: 4 * 16_384]
    when = ctx.field("notify_when", "")[:1000]
    try:
        validate.check_storable([text, when])
        schema = inputs.schema_text(text)
        fields = inputs.monitor_fields({"output_schema": schema, "notify_when": when}, {})
    except ValidationError as exc:
        return web.json_response(
            {"ok": False, "field": exc.field, "message": exc.message},
            headers={"Cache-Control": "no-store"},
        )
    shown = fields["output_schema"]
    props = list((shown or {}).get("properties") or {})
    summary = (
        f"A valid JSON Schema: a JSON object with {', '.join(props) or 'any properties'}."
        if shown is not None
        else "No schema: the answer is free text."
    )
    return web.json_response(
        {"ok": True, "message": summary, "notify_when": fields["notify_when"]},
        headers={"Cache-Control": "no-store"},
    )


async def preview(ctx: Ctx) -> web.StreamResponse:
    """The form's live preview: the next fire times of an expression, nothing stored."""
    kind = ctx.query("kind") or "auto"
    expression = (ctx.query("expression") or "")[:2000]
    timezone = (ctx.query("timezone") or "UTC")[:100]
    try:
        validate.check_storable([kind, expression, timezone])
        if kind not in CHOICES["kind"]:
            raise ValidationError("kind", f"must be one of {', '.join(CHOICES['kind'])}")

        def compute() -> tuple[spec.Spec, list[datetime]]:
            parsed = parse_expression(kind, expression, timezone)
            return parsed, preview_times(parsed, ctx.now)

        parsed, times = await offload.run(compute)  # bounded math, off the event loop
    except ValidationError as exc:
        return web.json_response(
            {"error": {"field": exc.field, "message": exc.message}}, status=422
        )
    where = timefmt.zone(parsed.timezone)
    seconds = timefmt.any_seconds(times)
    return web.json_response(
        {
            "kind": parsed.kind,
            "expression": parsed.expression,
            "description": describe.describe(parsed.kind, parsed.expression),
            "fire_times": [
                {
                    "utc": timefmt.utc_text(t),
                    "local": timefmt.local_text(t, where, seconds=seconds),
                    "iso": t.isoformat(),
                    "relative": timefmt.relative(t, ctx.now),
                }
                for t in times
            ],
        },  # fmt: skip
        headers={"Cache-Control": "no-store"},
    )
