"""The console's follow-ups (docs/followups.md): the list, one follow-up with its ledger of
checks and its Cancel action, and the form that places one by key."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

from promptsched import errors
from promptsched.console import layout, timefmt
from promptsched.console.context import Ctx, NotFoundPage, redirect
from promptsched.console.html import Markup, Template, join
from promptsched.domain import FollowupState
from promptsched.errors import ValidationError
from promptsched.human import followups as human_followups
from promptsched.ops import fleet, followups, notify_targets, validate

PAGE_SIZE = 50
_UTC = timefmt.zone("UTC")

_LIST = Template("""<div class="toolbar">$filters
<a class="button primary" href="/followups/new">New follow-up</a></div>
$table
$more""")
_EMPTY = Template('<p class="empty">$text</p>')
_CURRENT = Template('<b aria-current="page">$text</b>')
_FILTERS = Template('<nav class="filters">$links</nav>')
_DETAIL = Template("""<p class="subtitle">$state <span class="muted">$explanation</span></p>
<div class="actions">$controls</div>
<section><h2>Checks</h2>
$checks</section>
<section><h2>Settings</h2>
<dl class="settings">$settings</dl>
<h3>Prompt</h3>
<pre class="prompt">$prompt</pre></section>""")
_DL_ROW = Template("<dt>$term</dt><dd>$value</dd>")
_FORM = Template("""$error<form method="post" action="/followups/new" class="schedule-form">
<input type="hidden" name="csrf" value="$csrf">
<div class="fields">$fields</div>
<div class="actions"><button type="submit" class="button primary">Place follow-up</button>
<a href="/followups">Cancel</a></div>
</form>""")
_ERROR = Template('<p class="flash error" role="alert">Not saved: $field — $message</p>\n')
_FIELD = Template("""<div class="field$invalid">
<label for="f-$name">$label</label>
$control<small class="hint">$hint</small>$message</div>""")
_INPUT = Template('<input id="f-$name" name="$name" type="text" value="$value" autocomplete="off">')
_TEXTAREA = Template('<textarea id="f-$name" name="$name" rows="$rows">$value</textarea>')
_SELECT = Template('<select id="f-$name" name="$name">$options</select>')
_OPTION = Template('<option value="$value"$selected>$value</option>')
_MESSAGE = Template('<small class="message" role="alert">$text</small>')

FIELDS = {
    "key": ("Key", "unique for you, e.g. order-4711-unshipped; the same key again changes nothing"),
    "in": ("First check in", "a delay: 30s, 15m, 24h, 7d"),
    "prompt": ("Prompt", "{{ name }} tags take the vars below"),
    "provider": ("Provider", 'a webhook provider answers {"recheck_in": "6h"} to be checked '
                 "again"),
    "vars": ("Vars (JSON object, optional)", '{"order_id": "4711"}'),
    "max_checks": ("Max checks", "the chain ends after this many (default 10)"),
    "horizon": ("Horizon (optional)", "no check after this long past the first (default 30d)"),
    "escalate_email": ("Escalate to (optional)", "an address told once when the chain is still "
                       "unresolved after the checks below"),
    "escalate_after": ("Escalate after checks", "a number below max checks"),
}  # fmt: skip


def _key(ctx: Ctx) -> str:
    key = ctx.request.match_info.get("key", "")
    try:
        return followups.check_key(key)
    except ValidationError:
        raise NotFoundPage() from None


def _stamp(text: str | None, ctx: Ctx) -> Markup | str:
    if not text:
        return "-"
    return timefmt.stamp(datetime.fromisoformat(text), _UTC, ctx.now)


def _state(item: dict[str, Any]) -> str:
    return human_followups.state_words(str(item["state"]), item.get("ended_reason"))


def decision_words(found: dict[str, Any] | None, *, final: bool = False) -> str:
    return human_followups.decision_words(found, _UTC, final=final)


def _named(ctx: Ctx) -> str | None:
    """The owner an admin's ``?owner=`` names (a key is unique per owner); None otherwise."""
    return (ctx.query("owner") or "")[:100] or None if ctx.who.admin else None


def _href(key: str, owner: str | None) -> str:
    query = f"?{urlencode({'owner': owner})}" if owner else ""
    return f"/followups/{quote(key, safe='')}{query}"


async def list_page(ctx: Ctx) -> web.StreamResponse:
    """An admin sees every owner's follow-ups (or one owner's with ``?owner=``), as on the
    schedules page; any other session its owner's."""
    state = ctx.query("state")
    state = state if state in followups.STATES else None
    before = ctx.int_query("before")
    whose = ctx.scope or _named(ctx)
    items = await followups.list_(
        ctx.deps.pool, whose, state, before_id=before, limit=PAGE_SIZE + 1
    )
    more: Markup | str = ""
    if len(items) > PAGE_SIZE:
        items = items[:PAGE_SIZE]
        query = urlencode(
            {k: v for k, v in (("state", state), ("before", items[-1]["schedule_id"])) if v}
        )
        more = layout.link(f"/followups?{query}", "Older →")
    links = [_CURRENT(text="all") if state is None else layout.link("/followups", "all")]
    for name in followups.STATES:
        links.append(_CURRENT(text=name) if name == state
                     else layout.link(f"/followups?state={name}", name))  # fmt: skip
    admin = ctx.who.admin
    rows = [
        (layout.link(_href(i["key"], i["owner"] if admin else None), i["key"]), _state(i),
         f"{i['checks_done']} of {i['max_checks']}", _stamp(i["due_at"], ctx),
         _stamp(i["created_at"], ctx), *((i["owner"],) if admin else ()))
        for i in items
    ]  # fmt: skip
    head = ("Key", "State", "Checks", "First check", "Placed", *(("Owner",) if admin else ()))
    table = (
        layout.table(head, rows)
        if rows
        else _EMPTY(text="No follow-ups. Place one with the form, the API (POST /v1/followups) "
                    "or `promptsched followups add`.")
    )  # fmt: skip
    body = _LIST(filters=_FILTERS(links=join(links, " · ")), table=table, more=more)
    return layout.page(ctx, "Follow-ups", body)


async def detail_page(ctx: Ctx) -> web.StreamResponse:
    key = _key(ctx)
    named = _named(ctx)
    try:
        data = await followups.show(ctx.deps.pool, named or ctx.who.owner, key)
    except errors.NotFound:
        raise NotFoundPage() from None
    checks = [
        (c["number"], layout.link(f"/runs/{c['run_id']}", f"#{c['run_id']}") if c["run_id"]
         else "-", c["status"], decision_words(c["decision"], final=c["outcome"] == "done"),
         human_followups.outcome_words(c["outcome"]),
         ", ".join(f"step {s + 1}" for s in c["escalated"]) or "-")
        for c in data["checks"]
    ]  # fmt: skip
    table = (
        layout.table(("#", "Run", "Status", "Decision", "Outcome", "Escalated"), checks)
        if checks
        else _EMPTY(text="No check has finished yet.")
    )
    steps = (
        "; ".join(
            f"after {s['after_checks']} unresolved checks: "
            f"{notify_targets.words(s['notify'], when=False)}"
            for s in data["escalate"]
        )
        or "none"
    )
    settings = [
        ("Key", data["key"]),
        ("State", _state(data)),
        ("First check", _stamp(data["due_at"], ctx)),
        ("Checks", f"{data['checks_done']} of at most {data['max_checks']}"),
        ("Horizon", _stamp(data["horizon"], ctx)),
        ("Vars", json.dumps(data["vars"], ensure_ascii=False) if data["vars"] else "none"),
        ("Provider", data["provider"]),
        ("Notify", notify_targets.words(data.get("notify")) if data.get("notify") else "nobody"),
        ("Escalation", steps),
        ("Schedule", layout.link(f"/schedules/{data['schedule_id']}", f"#{data['schedule_id']}")),
        ("Placed", _stamp(data["created_at"], ctx)),
    ]
    if data["cancelled_at"]:
        settings.append(("Cancelled", join([f"by {data['cancelled_by']} ",
                                            _stamp(data["cancelled_at"], ctx)])))  # fmt: skip
    controls: Markup | str = ""
    if data["state"] == FollowupState.ACTIVE:
        owner = f"?{urlencode({'owner': named})}" if named else ""
        controls = layout.action(
            ctx, f"/followups/{quote(key, safe='')}/cancel{owner}", "Cancel follow-up",
            confirm=f"Cancel {key!r}? No further check starts.",
        )  # fmt: skip
    body = _DETAIL(
        state=layout.badge(data["state"], _state(data)),
        explanation=data["explanation"],
        controls=controls,
        checks=table,
        settings=join(_DL_ROW(term=t, value=v) for t, v in settings),
        prompt=data["prompt"],
    )
    return layout.page(ctx, f"Follow-up {key}", body)


async def cancel(ctx: Ctx) -> web.StreamResponse:
    key = _key(ctx)
    named = _named(ctx)
    async with ctx.deps.pool.acquire() as conn:
        try:
            await followups.cancel(conn, named or ctx.who.owner, key, actor=ctx.who.actor,
                                   clock=ctx.deps.clock)  # fmt: skip
        except errors.NotFound:
            raise NotFoundPage() from None
    owner = f"&{urlencode({'owner': named})}" if named else ""
    return redirect(f"/followups/{quote(key, safe='')}?done=followup_cancelled{owner}")


def _owner_field(field: str) -> str:
    top = field.split(".", 1)[0].split("[", 1)[0]
    if top == "escalate":
        return "escalate_after" if field.endswith("after_checks") else "escalate_email"
    return top


def _form(
    ctx: Ctx, values: dict[str, str], error: ValidationError | None = None, status: int = 200
) -> web.Response:
    wrong = _owner_field(error.field) if error is not None else None
    parts = []
    for name, (label, hint) in FIELDS.items():
        if name == "provider":
            options = join(_OPTION(value=p, selected=Markup(" selected") if p == values[name]
                                   else "") for p in ctx.deps.providers)  # fmt: skip
            control = _SELECT(name=name, options=options)
        elif name in ("prompt", "vars"):
            control = _TEXTAREA(name=name, value=values[name], rows=4 if name == "prompt" else 2)
        else:
            control = _INPUT(name=name, value=values[name])
        message = _MESSAGE(text=error.message) if error is not None and wrong == name else ""
        parts.append(_FIELD(invalid=" invalid" if wrong == name else "", name=name, label=label,
                            control=control, hint=hint, message=message))  # fmt: skip
    body = _FORM(
        error=_ERROR(field=error.field, message=error.message) if error else "",
        csrf=ctx.csrf, fields=join(parts),
    )  # fmt: skip
    return layout.page(ctx, "New follow-up", body, status=status)


async def new_form(ctx: Ctx) -> web.StreamResponse:
    values = {name: "" for name in FIELDS}
    values["provider"] = ctx.deps.providers[0] if ctx.deps.providers else "echo"
    return _form(ctx, values)


def _body(values: dict[str, str]) -> dict[str, Any]:
    validate.check_storable(values)
    body: dict[str, Any] = {"key": values["key"].strip(), "prompt": values["prompt"],
                            "provider": values["provider"]}  # fmt: skip
    if values["in"].strip():
        body["in"] = values["in"].strip()
    if values["vars"].strip():
        try:
            body["vars"] = json.loads(values["vars"])
        except ValueError:
            raise ValidationError(
                "vars", 'must be a JSON object, e.g. {"order_id": "4711"}'
            ) from None
    if values["max_checks"].strip():
        if not values["max_checks"].strip().isdigit():
            raise ValidationError("max_checks", "must be a whole number")
        body["max_checks"] = int(values["max_checks"])
    if values["horizon"].strip():
        body["horizon"] = values["horizon"].strip()
    email, after = values["escalate_email"].strip(), values["escalate_after"].strip()
    if email or after:
        if not after.isdigit():
            raise ValidationError("escalate[0].after_checks", "give the number of checks")
        body["escalate"] = [{"after_checks": int(after), "notify": {"email": [email]}}]
    return body


async def create(ctx: Ctx) -> web.StreamResponse:
    values = {name: ctx.field(name) for name in FIELDS}
    deps = ctx.deps
    try:
        body = _body(values)
        async with deps.pool.acquire() as conn:
            found = await fleet.current(deps.pool, deps.clock, deps.published)
            created, data = await followups.create(
                conn, deps.clock, body, owner=ctx.who.owner, actor=ctx.who.actor,
                **found.checks(),
            )  # fmt: skip
    except ValidationError as exc:
        return _form(ctx, values, exc, status=422)
    except errors.StateConflict as exc:
        return _form(ctx, values, ValidationError("key", str(exc)), status=409)
    done = "followup_created" if created else "followup_exists"
    return redirect(f"/followups/{quote(data['key'], safe='')}?done={done}")
