"""State changes from the console: pause (optionally until an instant), resume, trigger now,
cancel, replay a dead run or notification. Each is confirmed (a dialog with the script, a
confirmation page without it), CSRF-checked by the route, and calls the same service
functions with the same owner scoping as the HTTP API."""

from __future__ import annotations

from aiohttp import web

from promptsched import errors
from promptsched.console import layout, timefmt
from promptsched.console.context import Ctx, NotFoundPage, redirect
from promptsched.errors import ValidationError
from promptsched.ops import lookups, notifications, validate
from promptsched.ops import runs as run_ops
from promptsched.ops import schedules as schedule_ops

MAX_REASON = 500


def _confirmed(ctx: Ctx) -> bool:
    return ctx.field(layout.CONFIRM_FIELD) == "1"


def _ask(
    ctx: Ctx, title: str, question: str, label: str, back: str, fields: dict[str, str] | None = None
) -> web.Response:
    """The confirmation page: the same POST again, now with ``confirmed``."""
    form = layout.action(
        ctx, ctx.request.path, label, confirm="", cls="button primary",
        fields={**(fields or {}), layout.CONFIRM_FIELD: "1"},
    )  # fmt: skip
    return layout.confirm_page(ctx, title, question, form, back)


async def _schedule(ctx: Ctx) -> tuple[int, str, str]:
    """The id, name and zone of the schedule in the path, if it is the session's to see."""
    sid = ctx.path_id()
    row = await lookups.schedule(ctx.deps.pool, sid, ctx.scope)
    if row is None:
        raise NotFoundPage()
    return sid, row.name, row.timezone


async def pause(ctx: Ctx) -> web.StreamResponse:
    sid, name, zone_name = await _schedule(ctx)
    raw_until = ctx.field("until").strip()
    reason = ctx.field("reason").strip() or None
    until = None
    if raw_until:
        until = validate.instant(raw_until[:64], "until", zone=timefmt.zone(zone_name))
        if until <= ctx.now:
            raise ValidationError("until", "must be in the future")
    if reason is not None:
        validate.check_storable(reason, "reason")
        if len(reason) > MAX_REASON:
            raise ValidationError("reason", f"must be at most {MAX_REASON} characters")
    if not _confirmed(ctx):
        when = f" until {timefmt.local_text(until, timefmt.zone(zone_name))}" if until else ""
        return _ask(
            ctx, "Pause schedule", f"Pause {name!r}{when}? No new runs start meanwhile.",
            "Yes, pause", f"/schedules/{sid}", {"until": raw_until, "reason": reason or ""},
        )  # fmt: skip
    async with ctx.deps.pool.acquire() as conn:
        await schedule_ops.pause_schedule(
            conn, sid, owner=ctx.scope, actor=ctx.who.actor, until=until, reason=reason
        )
    return redirect(f"/schedules/{sid}?done=paused")


async def resume(ctx: Ctx) -> web.StreamResponse:
    sid, name, _ = await _schedule(ctx)
    if not _confirmed(ctx):
        return _ask(
            ctx, "Resume schedule",
            f"Resume {name!r}? Slots missed while paused meet its misfire policy.",
            "Yes, resume", f"/schedules/{sid}",
        )  # fmt: skip
    async with ctx.deps.pool.acquire() as conn:
        await schedule_ops.resume_schedule(conn, sid, owner=ctx.scope, actor=ctx.who.actor)
    return redirect(f"/schedules/{sid}?done=resumed")


async def trigger(ctx: Ctx) -> web.StreamResponse:
    sid, name, _ = await _schedule(ctx)
    if not _confirmed(ctx):
        return _ask(
            ctx, "Trigger now", f"Run {name!r} now, outside its cadence?", "Yes, run it now",
            f"/schedules/{sid}",
        )  # fmt: skip
    async with ctx.deps.pool.acquire() as conn:
        await schedule_ops.trigger_schedule(
            conn, ctx.deps.clock, sid, owner=ctx.scope, actor=ctx.who.actor
        )
    return redirect(f"/schedules/{sid}?done=triggered")


async def _run(ctx: Ctx) -> int:
    rid = ctx.path_id()
    if await lookups.run(ctx.deps.pool, rid, ctx.scope) is None:
        raise NotFoundPage()
    return rid


async def cancel(ctx: Ctx) -> web.StreamResponse:
    rid = await _run(ctx)
    if not _confirmed(ctx):
        return _ask(
            ctx, "Cancel run", f"Cancel run {rid}? A running run stops at its next heartbeat.",
            "Yes, cancel it", f"/runs/{rid}",
        )  # fmt: skip
    async with ctx.deps.pool.acquire() as conn:
        await run_ops.cancel_run(conn, ctx.deps.clock, rid, owner=ctx.scope, actor=ctx.who.actor)
    return redirect(f"/runs/{rid}?done=cancelled")


async def replay(ctx: Ctx) -> web.StreamResponse:
    rid = await _run(ctx)
    if not _confirmed(ctx):
        return _ask(
            ctx, "Replay run", f"Replay dead run {rid}? A new run for the same slot is created.",
            "Yes, replay it", f"/runs/{rid}",
        )  # fmt: skip
    async with ctx.deps.pool.acquire() as conn:
        row = await run_ops.replay_run(
            conn, ctx.deps.clock, rid, owner=ctx.scope, actor=ctx.who.actor
        )
    return redirect(f"/runs/{row['id']}?done=replayed")


async def replay_notification(ctx: Ctx) -> web.StreamResponse:
    nid = ctx.path_id()
    if await lookups.notification(ctx.deps.pool, nid, ctx.scope) is None:
        raise NotFoundPage()
    if not _confirmed(ctx):
        return _ask(
            ctx, "Replay notification", f"Send notification {nid} again?", "Yes, send it again",
            "/dead",
        )  # fmt: skip
    try:
        replayed = await notifications.replay_notification(
            ctx.deps.pool, nid, ctx.scope, clock=ctx.deps.clock
        )
    except ValidationError as exc:  # it exists but is not dead
        raise errors.StateConflict(exc.message) from None
    if replayed is None:
        raise NotFoundPage()
    return redirect("/dead?done=notification_replayed")
