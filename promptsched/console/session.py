"""Console sessions: logging in with an API token starts a session (``auth.start_session``)
whose own secret goes in an HttpOnly, SameSite=Strict cookie, never the token itself; each page
checks it (a revoked token ends its sessions too); logging out ends the session, its cookie
and its open event streams. Both cookies are ``Secure`` whenever the browser reached us over
https (``edge.is_https``), and failed logins slow their client down (``web/logins.py``). CSRF
tokens (an HMAC of the session secret, or a double-submit
cookie on the login form); the login and logout pages."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from aiohttp import web

from promptsched.console import context, layout
from promptsched.console.context import Ctx, Forbidden
from promptsched.console.html import Template
from promptsched.web import auth, edge, logins
from promptsched.web.deps import DEPS

SESSION_COOKIE = "promptsched_session"
LOGIN_COOKIE = "promptsched_login"  # the login form's double-submit CSRF token
_CSRF_CONTEXT = b"promptsched console csrf v1"
_LOGIN = Template("""<form method="post" action="/login" class="card narrow">
<input type="hidden" name="csrf" value="$csrf">
<p>Paste an API token (<code>promptsched tokens create --owner NAME</code>). The console acts
with its owner's rights, exactly like the HTTP API.</p>
$error<label for="token">API token</label>
<input id="token" name="token" type="password" autocomplete="off" required autofocus
       spellcheck="false">
<div class="actions"><button type="submit" class="button primary">Log in</button></div>
</form>""")
_ERROR = Template('<p class="flash error" role="alert">$message</p>\n')
_WAIT = "Too many failed logins from your address: try again in {seconds} s."


def session_token(request: web.Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE) or None


def csrf_token(token: str) -> str:
    """The CSRF token of a session: an HMAC keyed by the session token, so it proves the form
    came from a page the session was shown, and reveals nothing of the token itself."""
    return hmac.new(token.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def check_csrf(token: str, submitted: object) -> None:
    """Raise Forbidden unless ``submitted`` is the session's CSRF token (constant time)."""
    if not isinstance(submitted, str) or not hmac.compare_digest(
        submitted.encode(), csrf_token(token).encode()
    ):
        raise Forbidden()


def _cookie(response: web.StreamResponse, request: web.Request, name: str, value: str) -> None:
    response.set_cookie(
        name, value, path="/", httponly=True, samesite="Strict", secure=edge.is_https(request)
    )


def _clear(response: web.StreamResponse, request: web.Request, name: str) -> None:
    response.del_cookie(
        name, path="/", httponly=True, samesite="Strict", secure=edge.is_https(request)
    )


async def login_form(request: web.Request) -> web.StreamResponse:
    deps = request.app[DEPS]
    if await auth.authenticate_session(session_token(request), deps.pool, deps.clock) is not None:
        return context.redirect("/")
    return _login_page(request, None, 200)


def _login_page(request: web.Request, error: str | None, status: int) -> web.Response:
    csrf = secrets.token_urlsafe(32)
    message = _ERROR(message=error) if error else ""
    response = layout.page(None, "Log in", _LOGIN(csrf=csrf, error=message), status=status)
    _cookie(response, request, LOGIN_COOKIE, csrf)
    return response


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    expected = request.cookies.get(LOGIN_COOKIE, "")
    submitted = form.get("csrf")
    if not expected or not isinstance(submitted, str):
        raise Forbidden()
    if not hmac.compare_digest(submitted.encode(), expected.encode()):
        raise Forbidden()
    backoff, client = request.app[logins.LOGINS], edge.client(request)
    wait = backoff.retry_after(client)
    if wait:  # the token is not even looked at until the wait is over
        refused = _login_page(request, _WAIT.format(seconds=wait), 429)
        refused.headers["Retry-After"] = str(wait)
        return refused
    token = form.get("token")
    token = token.strip() if isinstance(token, str) else ""
    deps = request.app[DEPS]
    who = await auth.authenticate_token(token, deps.pool, deps.clock)
    secret = await auth.start_session(deps.pool, who, deps.clock) if who is not None else None
    if secret is None:
        backoff.failed(client)
        return _login_page(request, "That token is unknown, revoked or mistyped.", 401)
    backoff.succeeded(client)
    response = context.redirect("/")
    _cookie(response, request, SESSION_COOKIE, secret)
    _clear(response, request, LOGIN_COOKIE)
    return response


async def logout(ctx: Ctx) -> web.StreamResponse:
    await auth.end_session(session_token(ctx.request), ctx.deps.pool, ctx.deps.clock)
    response = context.redirect("/login")
    _clear(response, ctx.request, SESSION_COOKIE)
    return response
