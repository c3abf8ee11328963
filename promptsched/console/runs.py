"""Run pages: a run's history table, one run (attempts with timings, worker, error, output,
notifications) and the dead letters (dead runs and dead notifications, with replay).

A run's output can be up to a provider's 10 MB: its page shows the first ``EXCERPT_CHARS``
characters (rendered from Markdown in a worker thread with a deadline) and links to the whole
text (``/runs/{id}/output``, streamed), so no run page is more than about a megabyte."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import asyncpg
from aiohttp import web

from promptsched import errors, markup, offload
from promptsched.console import layout, timefmt
from promptsched.console.context import Ctx, NotFoundPage
from promptsched.console.html import Markup, Template, join
from promptsched.domain import AttemptStatus, RunStatus
from promptsched.human import runs as human_runs
from promptsched.human import text
from promptsched.monitor import changes
from promptsched.ops import lookups, notifications
from promptsched.ops import runs as run_ops
from promptsched.web import download, progress

DEAD_PAGE = 25
_DETAIL = Template("""<p class="subtitle">$status <span class="muted">of $schedule · $origin \
· slot $slot</span></p>
<div class="actions">$actions</div>
$links<dl class="settings">
$facts</dl>
$live$error<h2>Output</h2>
$output
<h2>Attempts</h2>
$attempts
$transcripts<h2>Notifications</h2>
$sent""")
# While the run is unfinished, the script follows its event stream (the page works without
# it: reload to see the run's state).
_LIVE = Template("""<section class="live" id="live" data-events="/runs/$id/events">
<h2>Progress</h2>
<p class="muted" id="live-state">$state</p>
<ol class="steps" id="live-steps">$steps</ol></section>
""")
_WAITING = "Waiting for the next step; the steps appear here as they happen."
_OUTPUT = Template("""<div class="output md">$html</div>
<details><summary>As plain text</summary>$text</details>$more""")
# Of a long output, its page shows this many characters (rendered, and again as text: at most
# about 600 kB of HTML even when every character is escaped); the rest is behind the link.
EXCERPT_CHARS = 50_000
DIFF_LINES = 500  # lines (or JSON paths) of what changed shown on a run's page
_MORE = Template("""<p class="muted excerpt">Showing the first $shown of $total characters: \
<a href="/runs/$id/output">the whole output</a> as plain text.</p>""")
_TRANSCRIPT = Template("""<h3>Attempt $number · $status</h3>
<ol class="steps">$steps</ol>
""")
_STEP = Template(
    """<li data-key="$key"><span class="badge kind">$kind</span> <span class="muted">step \
$step$tokens</span><div class="step-text">$text</div>$detail</li>"""
)
_DETAIL_PRE = Template('<pre class="text clip">$text</pre>')
STEP_CLIP = 1500  # characters of a tool result or model reply shown per step
_DL_ROW = Template("<dt>$term</dt><dd>$value</dd>\n")
_PRE = Template('<pre class="text $cls">$text</pre>')
_ERROR = Template('<h2>Error</h2>\n<pre class="text error">$text</pre>\n')
_EMPTY = Template('<p class="muted">$text</p>')
_DEAD = Template("""<section><h2>Dead runs</h2>
<p class="muted">Runs whose retries ran out or that failed permanently. A replay is a new run
for the same slot (each dead run can be replayed once).</p>
$runs
$runs_more</section>
<section><h2>Dead notifications</h2>
<p class="muted">Notifications the outbox gave up on. A replay owes the same message again, to
the schedule's current target.</p>
$notes
$notes_more</section>""")


def blockers(rows: Sequence[asyncpg.Record]) -> dict[int, int]:
    """For each overlap skip of a page of one schedule's runs, the run it waited for: the
    latest earlier run not skipped that was unfinished when the skip was written."""
    found: dict[int, int] = {}
    ran = [r for r in rows if r["status"] != RunStatus.SKIPPED and r["started_at"] is not None]
    for skip in rows:
        if skip["skip_reason"] != "overlap":
            continue
        at = skip["created_at"]
        earlier = [r for r in ran if r["id"] < skip["id"] and r["started_at"] <= at
                   and (r["finished_at"] is None or r["finished_at"] >= at)]  # fmt: skip
        if earlier:
            found[skip["id"]] = max(r["id"] for r in earlier)
    return found


def _notes(row: asyncpg.Record, waited: tuple[int, bool] | None = None) -> str:
    """What the history should say besides the status: skip reason (an overlap skip with the
    run it waited for), coalesced slots, replay."""
    notes = []
    if waited is not None:
        notes.append(human_runs.overlap_words(waited[0], restarted=waited[1]))
    elif row["skip_reason"]:
        notes.append(human_runs.skip_words(row["skip_reason"]))
    if row["missed_slots"]:
        notes.append(f"stands for {row['missed_slots']} missed slot(s) (coalesced)")
    if row["replay_of"]:
        notes.append(f"replay of run {row['replay_of']}")
    if row["error"] and row["status"] != RunStatus.SKIPPED:
        error = row["error"]
        notes.append(text.clip(error, 100))
    decision = row["notify_decision"]
    if isinstance(decision, dict):  # a monitor's: as `promptsched runs list` says it
        told = "notified" if decision.get("notify") else "not notified"
        notes.append(f"{told}: {decision.get('reason')}")
    return "; ".join(notes)


def run_table(
    ctx: Ctx,
    rows: Sequence[asyncpg.Record],
    where: ZoneInfo,
    waited: Mapping[int, tuple[int, bool]] | None = None,
) -> Markup:
    """A schedule's runs; ``waited``: an overlap skip's run id -> the run it waited for, and
    whether that run lost an attempt to a restart."""
    waited = waited or {}
    # one format a column: seconds on every time of it when any needs them
    slot_seconds = timefmt.any_seconds(r["slot"] for r in rows)
    finished_seconds = timefmt.any_seconds(r["finished_at"] for r in rows if r["finished_at"])
    return layout.table(
        ("Run", "Slot", "Origin", "Status", "Attempts", "Finished", "Notes"),
        [
            (
                layout.link(f"/runs/{r['id']}", f"#{r['id']}"),
                timefmt.stamp(r["slot"], where, ctx.now, seconds=slot_seconds),
                r["origin"],
                layout.badge(r["status"]),
                f"{r['attempts']}/{r['max_attempts']}",
                timefmt.stamp(r["finished_at"], where, seconds=finished_seconds),
                _notes(r, waited.get(r["id"])),
            )
            for r in rows
        ],
        cls="grid runs",
    )


def run_actions(ctx: Ctx, rid: int, status: str, replayed_by: int | None) -> Markup:
    """Cancel for an unfinished run; replay for a dead one not replayed yet."""
    if status in (RunStatus.PENDING, RunStatus.RUNNING):
        return layout.action(
            ctx, f"/runs/{rid}/cancel", "Cancel run", cls="button danger",
            confirm=f"Cancel run {rid}? A running run stops at its next heartbeat.",
        )  # fmt: skip
    if status == RunStatus.DEAD and replayed_by is None:
        return layout.action(
            ctx, f"/runs/{rid}/replay", "Replay", cls="button primary",
            confirm=f"Replay run {rid}? A new run for the same slot is created.",
        )  # fmt: skip
    return Markup("")


def _attempts(ctx: Ctx, rows: Sequence[asyncpg.Record], where: ZoneInfo) -> Markup:
    if not rows:
        return _EMPTY(text="No attempt yet.")
    return layout.table(
        ("#", "Status", "Worker", "Started", "Finished", "Took", "Error"),
        [
            (
                a["number"],
                layout.badge(a["status"]),
                a["worker_id"],
                timefmt.stamp(a["started_at"], where, ctx.now),
                timefmt.stamp(a["finished_at"], where),
                timefmt.duration(a["started_at"], a["finished_at"]),
                a["error"] or "",
            )
            for a in rows
        ],
    )


async def _output(rid: int, text: str | None) -> Markup:
    """The output rendered from its Markdown (sanitized), with the text as it came; of a long
    output, its first ``EXCERPT_CHARS`` characters and a link to the whole. The Markdown is
    read in a worker thread with a deadline (past it, the text alone is shown)."""
    if text is None:
        return _EMPTY(text="No output.")
    shown, cut = markup.prefix(text, EXCERPT_CHARS)
    try:
        render = functools.partial(markup.render_markdown, shown)
        html = Markup(
            await offload.run(render, field=None, deadline=offload.RENDER_DEADLINE, lane="render")
        )
    except TimeoutError:
        html = _PRE(text=shown, cls="output")
    more = _MORE(shown=f"{len(shown):,}", total=f"{len(text):,}", id=rid) if cut else ""
    return _OUTPUT(html=html, text=_PRE(text=shown, cls="output"), more=more)


def _json_excerpt(data: Any) -> str:
    """A structured answer as indented JSON, written only as far as ``EXCERPT_CHARS``."""
    parts: list[str] = []
    used = 0
    for chunk in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(data):
        parts.append(chunk)
        used += len(chunk)
        if used > EXCERPT_CHARS:
            return "".join(parts)[:EXCERPT_CHARS] + "\n… (cut here: the whole answer is the output)"
    return "".join(parts)


def _spent(row: Any) -> str:
    """What a run that did not succeed spent over its attempts (its usage is a success's)."""
    tokens, cost = row["tokens"] or 0, row["cost"] or 0
    if not tokens and not cost:
        return "—"
    said = f"{tokens} tokens over {row['attempts']} attempt(s)"
    return said + (f" (cost {cost:.4f})" if cost else "")


def _usage(usage: dict[str, Any] | None) -> str:
    """Token usage in words: "prompt 120 · completion 40 · total 160 tokens"."""
    if not usage:
        return "—"
    parts = [f"{key.removesuffix('_tokens').replace('_', ' ')} {value}"
             for key, value in usage.items() if isinstance(value, int | float)]  # fmt: skip
    return " · ".join(parts) + " tokens" if parts else json.dumps(usage, sort_keys=True)


def _clip(text: str, limit: int = STEP_CLIP) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def _step_detail(step: dict[str, Any]) -> str:
    """What a step carried beyond its one-line text: the model's reply, a tool's arguments or
    result, an error; clipped."""
    kind = step.get("kind")
    if kind == "model" and step.get("content"):
        return str(step["content"])
    if kind == "tool_call" and step.get("arguments") is not None:
        return json.dumps(step["arguments"], ensure_ascii=False, sort_keys=True)
    if kind == "tool_result":
        return str(step.get("error") or step.get("result") or "")
    return ""


def _steps(attempt: asyncpg.Record) -> Markup:
    """An attempt's steps: kind, step number, tokens so far, text and detail (clipped). Each
    carries the key the live stream's events are matched by ("attempt:step:kind")."""
    items = []
    for step in attempt["transcript"] or []:
        if not isinstance(step, dict):
            continue
        detail = _step_detail(step)
        tokens = step.get("tokens")
        kind, number = str(step.get("kind", "step")), str(step.get("step", ""))
        items.append(_STEP(
            key=f"{attempt['number']}:{number}:{kind}", kind=kind, step=number,
            tokens=f" · {tokens} tokens" if tokens else "",
            text=_clip(str(step.get("text") or ""), 300),
            detail=_DETAIL_PRE(text=_clip(detail)) if detail else "",
        ))  # fmt: skip
    return join(items)


def _live(rid: int, attempts: Sequence[asyncpg.Record]) -> Markup:
    """An unfinished run's progress: the running attempt's steps so far, then (with the
    script) each new one as it happens."""
    running = [a for a in attempts if a["status"] == AttemptStatus.RUNNING]
    steps = _steps(running[-1]) if running else Markup("")
    return _LIVE(id=rid, state=_WAITING, steps=steps)


def _transcripts(attempts: Sequence[asyncpg.Record]) -> Markup:
    """Each agent attempt's steps, once the run is over (a running attempt's are live)."""
    parts = []
    for a in attempts:
        if not a["transcript"] or a["status"] == AttemptStatus.RUNNING:
            continue
        parts.append(_TRANSCRIPT(number=a["number"], status=a["status"], steps=_steps(a)))
    if not parts:
        return Markup("")
    return join([Markup("<h2>Transcript</h2>\n"), *parts])


async def events(ctx: Ctx) -> web.StreamResponse:
    """The run's live progress for the page's script: the API's event stream, by session."""
    try:
        return await progress.stream_run(
            ctx.request, pool=ctx.deps.pool, hub=ctx.deps.progress, run_id=ctx.path_id(),
            who=ctx.who, clock=ctx.deps.clock,
        )  # fmt: skip
    except errors.NotFound:
        raise NotFoundPage() from None


async def output(ctx: Ctx) -> web.StreamResponse:
    """The run's whole output as plain text, streamed (the run page links here)."""
    rid = ctx.path_id()
    try:
        text = await lookups.run_output(ctx.deps.pool, rid, ctx.scope)
    except errors.NotFound:
        raise NotFoundPage() from None
    return await download.stream_text(ctx.request, text, filename=f"run-{rid}-output.txt")


def _sent(items: list[dict[str, object]]) -> Markup:
    if not items:
        return _EMPTY(text="None owed.")
    return layout.table(
        ("#", "Channel", "Event", "Status", "Attempts", "Last error"),
        [
            (n["id"], n["channel"], n["event"], layout.badge(str(n["status"])), n["attempts"],
             n["last_error"] or "")
            for n in items
        ],
    )  # fmt: skip


async def _monitor_facts(ctx: Ctx, row: asyncpg.Record) -> list[tuple[str, object]]:
    """A monitor's run: whether it notified and why, what changed since the run it was
    compared with, and its structured answer."""
    facts: list[tuple[str, object]] = []
    decision = row["notify_decision"]
    if isinstance(decision, dict):
        told = "notified" if decision.get("notify") else "not notified"
        since = decision.get("since")
        words: list[object] = [f"{told}: {decision.get('reason')}"]
        if since is not None:
            words += [" (compared with ", _run_link(int(since)), ")"]
        facts.append(("Notify", join(words)))
        if since is not None and row["output"] is not None:
            try:
                found = await run_ops.diff_runs(ctx.deps.pool, int(since), row["id"], ctx.scope)
            except (errors.NotFound, errors.ValidationError):  # that run is gone
                found = None
            if found is not None and found["changed"]:
                lines = found.get("diff") or [changes.line_of(p) for p in found.get("paths", [])]
                more = len(lines) - DIFF_LINES
                shown = lines[:DIFF_LINES] + ([f"… ({more} more lines)"] if more > 0 else [])
                facts.append(("What changed", _PRE(text="\n".join(shown), cls="diff")))
    if row["output_json"] is not None:
        text_json = _json_excerpt(row["output_json"])
        facts.append(("Answer (JSON)", _PRE(text=text_json, cls="json")))
    return facts


def _run_link(run_id: int) -> Markup:
    return layout.link(f"/runs/{run_id}", f"run #{run_id}")


def _links(row: asyncpg.Record, replayed_by: int | None) -> Markup:
    links: list[object] = []
    if row["replay_of"]:
        links.append(join(["replay of ", _run_link(row["replay_of"])]))
    if replayed_by is not None:
        links.append(join(["replayed as ", _run_link(replayed_by)]))
    if row["cancel_requested"]:
        links.append("cancel requested: it stops at its worker's next heartbeat")
    return join([_EMPTY(text=join(links, " · ")), "\n"]) if links else Markup("")


async def detail_page(ctx: Ctx) -> web.StreamResponse:
    rid = ctx.path_id()
    pool = ctx.deps.pool
    try:
        parts = await lookups.run_parts(pool, rid, ctx.scope)
    except errors.NotFound:
        raise NotFoundPage() from None
    row, attempts, sent = parts.row, parts.attempts, parts.sent
    schedule = await lookups.schedule(pool, row["schedule_id"], ctx.scope)
    if schedule is None:
        raise NotFoundPage()
    where = timefmt.zone(schedule.timezone)
    replayed_by = parts.replay["id"] if parts.replay is not None else None
    usage = _usage(row["usage"]) if row["usage"] else _spent(row)
    facts: list[tuple[str, object]] = [
        ("Attempts", f"{row['attempts']} of at most {row['max_attempts']}"),
        ("Provider", row["provider"]),
        ("Worker", row["worker_id"] or (attempts[-1]["worker_id"] if attempts else "—")),
        ("Created", timefmt.stamp(row["created_at"], where, ctx.now)),
        ("Available", timefmt.stamp(row["available_at"], where, ctx.now)),
        ("Started", timefmt.stamp(row["started_at"], where, ctx.now)),
        ("Finished", timefmt.stamp(row["finished_at"], where, ctx.now)),
        ("Took", timefmt.duration(row["started_at"], row["finished_at"])),
        ("Notes", _notes(row) or "—"),
        ("Usage", usage),
        *await _monitor_facts(ctx, row),
    ]
    if row["cleaned_chars"]:
        facts.append(("Cleaned", human_runs.cleaned_words(row["cleaned_chars"])))
    body = _DETAIL(
        status=layout.badge(row["status"]),
        schedule=layout.link(f"/schedules/{schedule.id}", schedule.name),
        origin=row["origin"],
        slot=timefmt.stamp(row["slot"], where, ctx.now),
        actions=run_actions(ctx, rid, row["status"], replayed_by),
        links=_links(row, replayed_by),
        facts=join(_DL_ROW(term=t, value=v) for t, v in facts),
        live=_live(rid, attempts) if not RunStatus(row["status"]).finished else "",
        error=_ERROR(text=row["error"]) if row["error"] else "",
        output=await _output(rid, row["output"]),
        attempts=_attempts(ctx, attempts, where),
        transcripts=_transcripts(attempts),
        sent=_sent(sent),
    )  # fmt: skip
    return layout.page(ctx, f"Run {rid}", body)


def _dead_runs(ctx: Ctx, rows: Sequence[asyncpg.Record]) -> Markup:
    if not rows:
        return _EMPTY(text="No dead runs.")
    table_rows = []
    for r in rows:
        where = timefmt.zone(r["timezone"])
        if r["replayed_by"] is not None:
            action = join(["replayed as ", _run_link(r["replayed_by"])])
        else:
            action = run_actions(ctx, r["id"], RunStatus.DEAD, None)
        table_rows.append((
            layout.link(f"/runs/{r['id']}", f"#{r['id']}"),
            layout.link(f"/schedules/{r['schedule_id']}", r["schedule_name"]),
            timefmt.stamp(r["slot"], where, ctx.now),
            f"{r['attempts']}/{r['max_attempts']}",
            r["error"] or "",
            action,
        ))  # fmt: skip
    return layout.table(("Run", "Schedule", "Slot", "Attempts", "Error", ""), table_rows)


def _dead_notes(ctx: Ctx, items: list[dict[str, object]]) -> Markup:
    if not items:
        return _EMPTY(text="No dead notifications.")
    rows = [
        (
            n["id"],
            layout.link(f"/schedules/{n['schedule_id']}", str(n["schedule_name"])),
            layout.link(f"/runs/{n['run_id']}", f"#{n['run_id']}"),
            f"{n['channel']} · {n['event']}",
            n["last_error"] or "",
            layout.action(
                ctx, f"/notifications/{n['id']}/replay", "Replay", cls="button primary",
                confirm=f"Send notification {n['id']} again?",
            ),
        )
        for n in items
    ]  # fmt: skip
    return layout.table(("#", "Schedule", "Run", "What", "Last error", ""), rows)


async def dead_page(ctx: Ctx) -> web.StreamResponse:
    pool = ctx.deps.pool
    runs_before, notes_before = ctx.int_query("runs_before"), ctx.int_query("notes_before")
    dead = await lookups.dead_runs_page(pool, ctx.scope, runs_before, DEAD_PAGE + 1)
    notes = await notifications.list_dead_notifications(
        pool, ctx.scope, before_id=notes_before, limit=DEAD_PAGE + 1
    )
    runs_more = notes_more = Markup("")
    if len(dead) > DEAD_PAGE:
        dead = dead[:DEAD_PAGE]
        query = urlencode({"runs_before": dead[-1]["id"]})
        runs_more = layout.link(f"/dead?{query}", "Older dead runs →")
    if len(notes) > DEAD_PAGE:
        notes = notes[:DEAD_PAGE]
        query = urlencode({"notes_before": notes[-1]["id"]})
        notes_more = layout.link(f"/dead?{query}", "Older dead notifications →")
    body = _DEAD(
        runs=_dead_runs(ctx, dead), runs_more=runs_more,
        notes=_dead_notes(ctx, notes), notes_more=notes_more,
    )  # fmt: skip
    return layout.page(ctx, "Dead letters", body)
