"""Sections of the schedule page: its settings, the controls (edit, trigger, pause with
'until', resume), the change history, and the 'explain' view for a chosen instant."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg

from promptsched import budgets, offload
from promptsched.console import form_page, layout, timefmt
from promptsched.console.context import Ctx
from promptsched.console.html import Markup, Template, join
from promptsched.domain import ChangeAction, Schedule
from promptsched.errors import ValidationError
from promptsched.human import describe
from promptsched.human import schedules as human_schedules
from promptsched.ops import explain, lookups, notify_targets, views

_DL_ROW = Template("<dt>$term</dt><dd>$value</dd>\n")
_DL = Template('<dl class="settings">\n$rows</dl>')
_PRE = Template('<pre class="text">$text</pre>')
_CODE = Template("<code>$text</code>")
_PAUSE_FIELDS = Template("""<label>until <input name="until" type="text" size="20" \
placeholder="YYYY-MM-DDTHH:MM" title="optional; in $zone, or with a UTC offset"></label>
<label>reason <input name="reason" type="text" size="16" maxlength="500"></label>""")
_EXPLAIN_FORM = Template("""<form method="get" action="/schedules/$id" class="explain-form">
<label for="at">Why did (or will) it fire or not at</label>
<input id="at" name="at" type="text" value="$at" size="22" title="in $zone, or with a UTC offset">
<button type="submit" class="button">Explain</button></form>
$result""")
_VERDICT = Template("""<div class="verdict"><p>$badge $message</p>
<p class="muted">previous fire time: $previous · next: $next</p>$runs</div>""")
_ERROR = Template('<p class="flash error" role="alert">$field: $message</p>')
MAX_VALUE = 120


def code(text: object) -> Markup:
    return _CODE(text=text)


def state_badge(row: Schedule, where: ZoneInfo) -> Markup:
    """enabled, paused (until when), or done: a one-shot that fired, a rule with no more
    fire times (the words are the CLI's)."""
    key = human_schedules.state_key(row.enabled, row.next_fire_at)
    if key == "paused" and row.paused_until is not None:
        return layout.badge(key, f"paused until {timefmt.local_text(row.paused_until, where)}")
    words = human_schedules.state_words(enabled=row.enabled, cursor=row.next_fire_at,
                                        kind=row.kind)  # fmt: skip
    return layout.badge(key, words)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _word(field: str, value: str) -> str:
    return form_page.OPTION_WORDS[field].get(value, value)


def spend_words(spend: Mapping[str, Any]) -> str:
    """This UTC day's and month's spend in words, each budget limit against it."""
    parts = []
    for period, label in (("day", "today"), ("month", "this month")):
        got = spend.get(period) or {}
        parts.append(
            f"{label} {budgets.amount('tokens', got.get('tokens', 0))}, "
            f"cost {budgets.amount('cost', got.get('cost', 0))}"
        )
    words = "; ".join(parts) + " (UTC)"
    limits = [budgets.standing_words(row) for row in spend.get("budget") or []]
    return words + ("; budget: " + "; ".join(limits) if limits else "")


def settings(ctx: Ctx, row: Schedule, spend: Mapping[str, Any] | None = None) -> Markup:
    data = views.schedule_json(row)
    where = timefmt.zone(row.timezone)
    words = describe.describe(row.kind, row.expression)
    items: list[tuple[str, object]] = [
        ("When", words),
        ("Expression", join([code(row.expression), f" ({row.kind})"])),
        ("Time zone", row.timezone),
        ("Provider", row.provider + (f" · model {row.model}" if row.model else "")),
        ("Params", code(_json(data["params"] or {}))),
        ("Misfire", f"{_word('misfire', data['misfire'])}, a slot counting as missed when found "
                    f"more than {data['misfire_grace']} late (at most {row.misfire_cap} "
                    f"run); catch-up window {data['catchup_window'] or 'none'}"),
        ("Overlap", _word("overlap", data["overlap"])),
        ("Attempts", f"at most {row.max_attempts}, each within {data['timeout']}"),
        ("Jitter", data["jitter"] or "none"),
        ("DST", f"a local time skipped by DST: {_word('dst_gap', row.dst_gap)}; "
                f"a repeated one: {_word('dst_fold', row.dst_fold)}"),
        ("When throttled", f"waits as the provider asks, gives up after "
                           f"{data['give_up_after']}; fallback: "
                           f"{', '.join(row.fallback) or 'none'}"),
        ("Auto-pause", f"after {row.pause_after_failures} dead runs in a row"
                       if row.pause_after_failures else "never"),
        ("Notify", notify_targets.words(notify_targets.public(row.notify)) if row.notify
                   else "nobody"),
        ("Budget", budgets.describe(row.budget)),
        ("Notify when", code(row.notify_when)),
        ("Output schema", _PRE(text=json.dumps(row.output_schema, indent=2))
                          if row.output_schema else "none: the answer is free text"),
        ("Owner", row.owner),
        ("Version", row.version),
        ("Created", timefmt.stamp(row.created_at, where, ctx.now)),
        ("Updated", timefmt.stamp(row.updated_at, where, ctx.now)),
    ]  # fmt: skip
    if spend is not None:
        items.insert(items.index(("Budget", budgets.describe(row.budget))) + 1,
                     ("Spend", spend_words(spend)))  # fmt: skip
    if row.pause_reason:
        items.insert(0, ("Pause reason", row.pause_reason))
    rows = join(_DL_ROW(term=term, value=value) for term, value in items)
    return join([_DL(rows=rows), Markup("\n<h3>Prompt</h3>\n"), _PRE(text=row.prompt)])


def controls(ctx: Ctx, row: Schedule) -> Markup:
    sid = row.id
    name = row.name
    parts = [
        layout.link(f"/schedules/{sid}/edit", "Edit"),
        layout.action(
            ctx, f"/schedules/{sid}/trigger", "Trigger now", confirm=f"Run {name!r} now?"
        ),
    ]
    if row.enabled or row.paused_until is not None:
        extra = _PAUSE_FIELDS(zone=row.timezone)
        parts.append(
            layout.action(
                ctx,
                f"/schedules/{sid}/pause",
                "Pause",
                extra=extra,
                confirm=f"Pause {name!r}? No new runs until it is resumed.",
            )  # fmt: skip
        )
    if not row.enabled:
        parts.append(
            layout.action(
                ctx,
                f"/schedules/{sid}/resume",
                "Resume",
                cls="button primary",
                confirm=f"Resume {name!r}? Slots missed meanwhile meet its misfire policy.",
            )  # fmt: skip
        )
    return join(parts, " ")


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else _json(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def change_summary(change: dict[str, Any]) -> Markup:
    changes = change["changes"] or {}
    action = change["action"]
    if action == ChangeAction.UPDATE:
        lines = [f"{key}: {_value(pair[0])} → {_value(pair[1])}" for key, pair in changes.items()
                 if isinstance(pair, list) and len(pair) == 2]  # fmt: skip
        return join(lines, Markup("<br>"))
    if action == ChangeAction.CREATE:
        fields = changes.get("fields") or {}
        zone = fields.get("timezone")
        return join(["created: ", code(fields.get("expression", "")), f" in {zone}"])
    if action == ChangeAction.TRIGGER and isinstance(changes.get("run_id"), int):
        return join(["run ", layout.link(f"/runs/{changes['run_id']}", changes["run_id"])])
    shown = {k: v for k, v in changes.items() if v is not None}
    return join([_value(shown)]) if shown else Markup("")


def history(ctx: Ctx, rows: list[asyncpg.Record], where: ZoneInfo) -> Markup:
    if not rows:
        return Markup('<p class="muted">No changes recorded.</p>')
    changes = [views.change(row) for row in rows]
    return layout.table(
        ("When", "Who", "What", "Details"),
        [
            (timefmt.stamp(row["at"], where, ctx.now), c["actor"], c["action"], change_summary(c))
            for row, c in zip(rows, changes, strict=True)
        ],
    )


async def explain_section(ctx: Ctx, row: Schedule, default_at: str) -> Markup:
    """The explain form, and its verdict when the page was asked about an instant."""
    where = timefmt.zone(row.timezone)
    raw = ctx.query("at")
    result = Markup("")
    if raw is not None:
        try:
            at, note = explain.resolve_at(raw[:64], row)
            result = await _verdict(ctx, row, at, where, note)
        except ValidationError as exc:
            result = _ERROR(field=exc.field, message=exc.message)
    return _EXPLAIN_FORM(id=row.id, at=raw or default_at, zone=row.timezone, result=result)


async def _verdict(
    ctx: Ctx, row: Schedule, at: datetime, where: ZoneInfo, note: str | None
) -> Markup:
    async with ctx.deps.pool.acquire() as conn:
        changes, found = await lookups.slot_history(conn, row.id, at)
    facts = explain.Facts(row, at, ctx.now, changes, found, retention=ctx.deps.retention,
                          note=note)  # fmt: skip
    answer = await offload.run(lambda: explain.explain(facts))  # bounded math, off the loop
    runs = [
        join([layout.link(f"/runs/{r['id']}", f"run {r['id']}"), " ", layout.badge(r["status"])])
        for r in answer["runs"]
    ]
    return _VERDICT(
        badge=layout.badge(answer["verdict"]),
        message=answer["message"],
        previous=_instant(answer["previous_fire_time"], where),
        next=_instant(answer["next_fire_time"], where),
        runs=join(runs, " · "),
    )


def _instant(iso: str | None, where: ZoneInfo) -> Markup:
    if iso is None:
        return Markup("none")
    return timefmt.stamp(datetime.fromisoformat(iso), where)
