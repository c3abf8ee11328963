"""The console's routes on the API's application: the session check, CSRF check and error
pages around every page, the two static files, and the security headers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources

import asyncpg
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from promptsched import errors
from promptsched.console import (
    actions,
    budget_page,
    followups_view,
    forms,
    layout,
    runs,
    schedules,
    session,
    status_page,
)
from promptsched.console.context import Ctx, Forbidden, NotFoundPage
from promptsched.errors import ValidationError
from promptsched.ops import lookups
from promptsched.ops import schedules as schedule_ops
from promptsched.web import auth, logins
from promptsched.web.deps import DEPS

log = structlog.get_logger("console")

PageHandler = Callable[[Ctx], Awaitable[web.StreamResponse]]
RawHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
# Paths the API owns; everything else under / is the console's.
API_PREFIXES = ("/v1/", "/healthz", "/readyz", "/metrics")
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
# What the API's error middleware answers for a console request too (a 4xx, never a page).
_ANSWERED_BY_API = (web.HTTPException, HttpProcessingError, web.RequestPayloadError)
_UNAVAILABLE = (OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError)


def is_console_path(path: str) -> bool:
    return path != "/v1" and not path.startswith(API_PREFIXES)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    if is_console_path(request.path):
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)


def _failure(exc: Exception, ctx: Ctx | None, request: web.Request) -> web.Response:
    """The page for an error a console request ends in."""
    if isinstance(exc, Forbidden):
        return layout.message_page(
            ctx, 403, "Refused",
            "The form was stale or did not come from this console (its CSRF token did not "
            "match). Nothing was changed. Reload the page and try again.",
        )  # fmt: skip
    if isinstance(exc, NotFoundPage | errors.NotFound):
        return layout.not_found(ctx)
    if isinstance(exc, errors.StateConflict | errors.VersionConflict):
        return layout.message_page(ctx, 409, "Not possible now", str(exc), back=request.path)
    if isinstance(exc, ValidationError):
        return layout.message_page(ctx, 422, "Invalid input", str(exc), back=request.path)
    if isinstance(exc, _UNAVAILABLE):
        log.warning("console.unavailable", error=repr(exc))
        return layout.message_page(ctx, 503, "Unavailable", "The database is unreachable.")
    log.exception("console.unexpected_error", method=request.method, path=request.path)
    return layout.message_page(ctx, 500, "Error", "Unexpected server error (it is logged).")


def _page(handler: PageHandler, *, post: bool = False) -> RawHandler:
    """A page for a logged-in session; a POST must carry the session's CSRF token."""

    async def handle(request: web.Request) -> web.StreamResponse:
        deps = request.app[DEPS]
        made: list[Ctx] = []

        async def attempt() -> web.StreamResponse:
            token = session.session_token(request)
            who = await auth.authenticate_session(token, deps.pool, deps.clock)
            if who is None or token is None:
                return layout.redirect_to_login(request)
            form = None
            if post:
                form = await request.post()
                session.check_csrf(token, form.get(layout.CSRF_FIELD))
            now = await schedule_ops.db_now(deps.pool, deps.clock)
            made[:] = [Ctx(request, deps, who, session.csrf_token(token), now, form)]
            return await handler(made[0])

        try:  # the request again if a schema change made a prepared statement stale
            return await lookups.retry_stale(attempt)
        except _ANSWERED_BY_API:
            # aiohttp's own (413 for a huge form), a broken or late body: the API's error
            # middleware answers
            raise
        except Exception as exc:
            return _failure(exc, made[0] if made else None, request)

    return handle


def _public(handler: RawHandler) -> RawHandler:
    """A page before login (the login form itself)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await lookups.retry_stale(lambda: handler(request))
        except _ANSWERED_BY_API:
            raise
        except Exception as exc:
            return _failure(exc, None, request)

    return handle


@cache
def _static_body(name: str) -> bytes:
    return (resources.files("promptsched.console") / "static" / name).read_bytes()


async def _static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC:
        return layout.not_found(None)
    return web.Response(
        body=_static_body(name),
        content_type=STATIC[name],
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )


ROUTES: tuple[tuple[str, str, RawHandler, str], ...] = (
    ("GET", "/", _page(schedules.list_page), "console.schedules"),
    ("GET", "/login", _public(session.login_form), "console.login"),
    ("POST", "/login", _public(session.login), "console.login"),
    ("POST", "/logout", _page(session.logout, post=True), "console.logout"),
    ("GET", "/preview", _page(forms.preview), "console.preview"),
    ("POST", "/schema-check", _page(forms.schema_check, post=True), "console.schema_check"),
    ("GET", "/schedules/new", _page(forms.new_form), "console.new"),
    ("POST", "/schedules/new", _page(forms.create, post=True), "console.new"),
    ("GET", "/schedules/{id}", _page(schedules.detail_page), "console.schedule"),
    ("GET", "/schedules/{id}/edit", _page(forms.edit_form), "console.edit"),
    ("POST", "/schedules/{id}/edit", _page(forms.save, post=True), "console.edit"),
    ("POST", "/schedules/{id}/pause", _page(actions.pause, post=True), "console.pause"),
    ("POST", "/schedules/{id}/resume", _page(actions.resume, post=True), "console.resume"),
    ("POST", "/schedules/{id}/trigger", _page(actions.trigger, post=True), "console.trigger"),
    ("GET", "/runs/{id}", _page(runs.detail_page), "console.run"),
    ("GET", "/runs/{id}/events", _page(runs.events), "console.run_events"),
    ("GET", "/runs/{id}/output", _page(runs.output), "console.run_output"),
    ("POST", "/runs/{id}/cancel", _page(actions.cancel, post=True), "console.cancel"),
    ("POST", "/runs/{id}/replay", _page(actions.replay, post=True), "console.replay"),
    ("GET", "/dead", _page(runs.dead_page), "console.dead"),
    ("GET", "/budget", _page(budget_page.show), "console.budget"),
    ("POST", "/budget", _page(budget_page.save, post=True), "console.budget"),
    ("GET", "/status", _page(status_page.show), "console.status"),
    ("GET", "/followups", _page(followups_view.list_page), "console.followups"),
    ("GET", "/followups/new", _page(followups_view.new_form), "console.followup_new"),
    ("POST", "/followups/new", _page(followups_view.create, post=True), "console.followup_new"),
    ("GET", "/followups/{key}", _page(followups_view.detail_page), "console.followup"),
    (
        "POST", "/followups/{key}/cancel", _page(followups_view.cancel, post=True),
        "console.followup_cancel",
    ),
    (
        "POST", "/notifications/{id}/replay", _page(actions.replay_notification, post=True),
        "console.replay_notification",
    ),
    ("GET", "/static/{name}", _static, "console.static"),
)  # fmt: skip


def mount(app: web.Application) -> None:
    """Add the console to the API's application (routes under ``/`` outside the API's)."""
    for method, path, handler, name in ROUTES:
        app.router.add_route(method, path, handler, name=name)
    app.on_response_prepare.append(_security_headers)
    app[logins.LOGINS] = logins.LoginBackoff()  # failed logins, per client, in this process
