"""The schedules list (expression in words and as written, zone, next fire times, last
outcome, state) and the page of one schedule."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import asyncpg
from aiohttp import web

from promptsched.console import layout, runs, schedule_parts, timefmt
from promptsched.console.context import Ctx, NotFoundPage
from promptsched.console.html import Markup, Template, join
from promptsched.domain import Schedule
from promptsched.human import describe
from promptsched.ops import budgets as budget_ops
from promptsched.ops import fleet, lookups, schemas, views

PAGE_SIZE = 50
RUNS_PAGE = 25
HISTORY_PAGE = 20
NEXT_IN_LIST = 1
NEXT_ON_PAGE = 10

_LIST = Template("""$cooling<div class="toolbar">
<form method="get" action="/" class="search"><input name="q" type="search" value="$q" \
placeholder="name contains…" aria-label="search by name">$owner_field
<button type="submit" class="button">Search</button></form>
<a class="button primary" href="/schedules/new">New schedule</a></div>
$table
$more""")
_EMPTY = Template('<p class="empty">$text</p>')
_SCROLL = Template('<div class="table-scroll">$table</div>')
_DRIFT = Template(
    '<p class="flash warn" role="status" id="drift">The running replicas publish $count '
    'different configurations: <a href="/status">Status</a> names the settings that differ.'
    "</p>\n"
)
_COOLING = Template(
    '<p class="flash warn" role="status">Provider <b>$provider</b> is cooling down until '
    "$until ($reason): no replica sends it a request until then; its runs wait as pending, "
    "then one probe goes first.</p>\n"
)
_WEATHER = Template(
    '<p class="flash warn provider-state" role="status">Provider <b>$provider</b>: $words.</p>\n'
)
_OWNER_FIELD = Template(""" <input name="owner" type="search" value="$owner" \
placeholder="owner" aria-label="only this owner's schedules">""")
_NAME = Template('<a href="/schedules/$id" class="name">$name</a>')
_WHEN = Template(
    '$words<br><code class="muted expr as-written" title="$expression">$expression</code>'
)
_WORDS_ONLY = Template('<code class="expr" title="$expression">$expression</code>')
_NOWRAP = Template('<span class="nowrap">$text</span>')
_WARNING = Template('<p class="flash warn" role="status">$text</p>\n')
_DETAIL = Template("""$warnings<p class="subtitle">$state
<span class="muted">#$id · $words · $zone</span></p>
<div class="actions">$controls</div>
<div class="columns">
<section><h2>Next fire times</h2>
$next</section>
<section><h2>Explain</h2>
$explain</section>
</div>
<section><h2>Runs</h2>
$filters
$runs
$more</section>
<section><h2>Settings</h2>
$settings</section>
<section><h2>Change history</h2>
$history</section>""")
_CURRENT = Template('<b aria-current="page">$text</b>')
_FILTERS = Template('<nav class="filters">$links</nav>')
_LIST_ITEMS = Template('<ol class="times">$items</ol>')
_ITEM = Template("<li>$value</li>")


def _next_times(row: Schedule, count: int, ctx: Ctx) -> Markup:
    where = timefmt.zone(row.timezone)
    times = views.next_fire_times(row, count)
    if not row.enabled and row.paused_until is None:
        return Markup('<span class="muted">paused</span>')
    if not times:
        return Markup('<span class="muted">none</span>')
    seconds = timefmt.any_seconds(times)
    if count == 1:
        return timefmt.stamp(times[0], where, ctx.now, seconds=seconds)
    items = join(_ITEM(value=timefmt.stamp(t, where, ctx.now, seconds=seconds)) for t in times)
    return _LIST_ITEMS(items=items)


def _when(row: Schedule) -> Markup:
    """The expression in words, and as written below when the words are not the text itself
    (a long expression is cut with an ellipsis; the whole of it is its tooltip)."""
    words = describe.describe(row.kind, row.expression)
    written = describe.as_written(row.kind, row.expression)
    if words == written:
        return _WORDS_ONLY(expression=written)
    return _WHEN(words=words, expression=written)


def _last_run(latest: asyncpg.Record | None, row: Schedule, ctx: Ctx) -> Markup:
    if latest is None:
        return Markup('<span class="muted">no run yet</span>')
    where = timefmt.zone(row.timezone)
    when = timefmt.stamp(latest["finished_at"] or latest["slot"], where, ctx.now)
    return join([layout.link(f"/runs/{latest['id']}", layout.badge(latest["status"])), " ", when])


async def list_page(ctx: Ctx) -> web.StreamResponse:
    name = ctx.query("q")
    after = ctx.int_query("after") or 0
    # An admin sees every owner's schedules, or one owner's; any other token only its own.
    owner = (ctx.query("owner") or "")[:100] if ctx.who.admin else ""
    rows = await lookups.schedules_page(
        ctx.deps.pool, owner=ctx.scope or owner or None, enabled=None,
        name=name[:200] if name else None, after_id=after, limit=PAGE_SIZE + 1,
    )  # fmt: skip
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    latest = await lookups.latest_finished(ctx.deps.pool, [r.id for r in rows])
    head = ["Name", "When", "Zone", "Next fire", "Last run", "State"]
    if ctx.who.admin:
        head.append("Owner")
    table_rows = []
    for row in rows:
        where = timefmt.zone(row.timezone)
        cells: list[object] = [
            _NAME(id=row.id, name=row.name),
            _when(row),
            _NOWRAP(text=row.timezone),
            _next_times(row, NEXT_IN_LIST, ctx),
            _last_run(latest.get(row.id), row, ctx),
            schedule_parts.state_badge(row, where),
        ]  # fmt: skip
        if ctx.who.admin:
            cells.append(_NOWRAP(text=row.owner))
        table_rows.append(cells)
    if table_rows:
        table = _SCROLL(table=layout.table(head, table_rows, cls="grid schedules"))
    else:
        text = (
            "No schedule matches." if name or owner else "No schedules yet: create the first one."
        )
        table = _EMPTY(text=text)
    query = {"q": name or "", "owner": owner, "after": str(rows[-1].id)} if more and rows else None
    more_link = layout.link("/?" + urlencode(query), "Next page →") if query else ""
    owner_field = _OWNER_FIELD(owner=owner) if ctx.who.admin else Markup("")
    cooling = join(
        _provider_state(state, ctx.now)
        for state in await lookups.provider_weather(ctx.deps.pool, ctx.deps.clock)
        if state["breaker"] == "open" or state["allowed_concurrency"] is not None
        or state["paced_until"] is not None
    )  # fmt: skip
    if ctx.who.admin:  # an operator hears of configuration drift on the first page
        count = len(
            {row["fingerprint"] for row in await fleet.alive(ctx.deps.pool, ctx.deps.clock)}
        )
        cooling = join([_DRIFT(count=count), cooling]) if count > 1 else cooling
    body = _LIST(
        cooling=cooling, q=name or "", owner_field=owner_field, table=table, more=more_link
    )
    return layout.page(ctx, "Schedules", body)


def _provider_state(state: dict[str, Any], now: datetime) -> Markup:
    """A provider's breaker, allowed concurrency and pacing, in words."""
    utc = timefmt.zone("UTC")
    if state["breaker"] == "open":
        return _COOLING(
            provider=state["provider"], reason=state["reason"] or "failing",
            until=timefmt.stamp(state["open_until"], utc, now),
        )  # fmt: skip
    words = []
    if state["allowed_concurrency"] is not None:
        words.append(
            f"allowed concurrency {state['allowed_concurrency']}, ramping back to its limit "
            "with its successes"
        )
    if state["paced_until"] is not None:
        words.append(
            f"paced by its own headers ({state['pace_header']}) until "
            f"{timefmt.stamp(state['paced_until'], utc, now)}: no replica sends it a request "
            "before then"
        )
    return _WEATHER(provider=state["provider"], words="; ".join(words))


def _run_filters(sid: int, status: str | None) -> Markup:
    links = [layout.link(f"/schedules/{sid}", "all") if status else _CURRENT(text="all")]
    for name in schemas.RUN_STATUSES:
        href = f"/schedules/{sid}?{urlencode({'status': name})}"
        links.append(_CURRENT(text=name) if name == status else layout.link(href, name))
    return _FILTERS(links=join(links, " · "))


async def _waited(pool: Any, rows: Sequence[Any]) -> dict[int, tuple[int, bool]]:
    """Each overlap skip's run it waited for, and whether that run lost an attempt (a restart
    in between): right after a restart such skips read as waiting, not as a hang."""
    blocking = runs.blockers(rows)
    lost = await lookups.restarted(pool, sorted(set(blocking.values())))
    return {skip: (run, run in lost) for skip, run in blocking.items()}


async def detail_page(ctx: Ctx) -> web.StreamResponse:
    sid = ctx.path_id()
    pool = ctx.deps.pool
    row = await lookups.schedule(pool, sid, ctx.scope)
    if row is None:
        raise NotFoundPage()
    where = timefmt.zone(row.timezone)
    status = ctx.query("status")
    status = status if status in schemas.RUN_STATUSES else None
    before = ctx.int_query("before")
    found = await lookups.runs_page(
        pool, schedule_id=sid, status=status, owner=ctx.scope, before_id=before,
        limit=RUNS_PAGE + 1,
    )  # fmt: skip
    more = ""
    if len(found) > RUNS_PAGE:
        found = found[:RUNS_PAGE]
        query = urlencode({k: v for k, v in (("status", status), ("before", found[-1]["id"])) if v})
        more = layout.link(f"/schedules/{sid}?{query}", "Older runs →")
    changes = await lookups.changes_page(pool, sid, ctx.scope, None, HISTORY_PAGE)
    upcoming = views.next_fire_times(row, 1)
    default_at = upcoming[0].astimezone(where).strftime("%Y-%m-%dT%H:%M:%S") if upcoming else ""
    seen = await fleet.current(pool, ctx.deps.clock, ctx.deps.published)
    body = _DETAIL(
        warnings=join(_WARNING(text=text) for text in fleet.schedule_warnings(seen, row)),
        state=schedule_parts.state_badge(row, where),
        id=sid,
        words=describe.describe(row.kind, row.expression),
        zone=row.timezone,
        controls=schedule_parts.controls(ctx, row),
        next=_next_times(row, NEXT_ON_PAGE, ctx),
        explain=await schedule_parts.explain_section(ctx, row, default_at),
        filters=_run_filters(sid, status),
        runs=runs.run_table(ctx, found, where, await _waited(pool, found))
        if found
        else _EMPTY(text="No runs."),
        more=more,
        settings=schedule_parts.settings(
            ctx, row, await budget_ops.schedule_spend(pool, row, ctx.deps.clock)
        ),
        history=schedule_parts.history(ctx, changes, where),
    )
    return layout.page(ctx, row.name, body)
