"""The page frame (head, navigation, flash message) and the small pieces every page uses:
status badges, confirmed action buttons carrying the CSRF token, tables and error pages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC

from aiohttp import web

from promptsched.console import context
from promptsched.console.context import Ctx
from promptsched.console.html import Markup, Template, join

CSRF_FIELD = "csrf"
CONFIRM_FIELD = "confirmed"

_PAGE = Template("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title · promptsched</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/console.css">
<script src="/static/console.js" defer></script>
</head>
<body data-now="$now">
<header class="top"><a class="brand" href="/">promptsched</a>$nav</header>
<main>
$flash<h1>$heading</h1>
$body
</main>
</body>
</html>
""")
_NAV = Template("""<nav>
<a href="/">Schedules</a><a href="/schedules/new">New schedule</a><a href="/dead">Dead letters</a>\
<a href="/followups">Follow-ups</a><a href="/budget">Budget</a><a href="/status">Status</a>
</nav>
<div class="who"><span title="the owner this token acts for">$owner</span>
<form method="post" action="/logout" class="inline">
<input type="hidden" name="csrf" value="$csrf"><button type="submit" class="link">Log out</button>
</form></div>""")
_ACTION = Template("""<form method="post" action="$action" class="inline" data-confirm="$confirm">
<input type="hidden" name="csrf" value="$csrf">$fields<button type="submit" class="$cls">$label\
</button></form>""")
_HIDDEN = Template('<input type="hidden" name="$name" value="$value">')
_FLASH = Template('<p class="flash $kind" role="status">$message</p>\n')
_BADGE = Template('<span class="badge st-$status">$text</span>')
_TABLE = Template('<table class="$cls">\n<thead><tr>$head</tr></thead>\n<tbody>\n$rows</tbody>\n'
                  "</table>")  # fmt: skip
_ROW = Template("<tr>$cells</tr>\n")
_CELL = Template("<td>$value</td>")
_TH = Template("<th>$value</th>")
_LINK = Template('<a href="$href">$text</a>')
_MESSAGE = Template('<p class="lead">$message</p>\n<p><a href="$back">$back_text</a></p>')

# Messages after a successful action (the redirect names one by code, never by text).
DONE = {
    "created": "Schedule created.",
    "saved": "Schedule saved.",
    "paused": "Schedule paused.",
    "resumed": "Schedule resumed.",
    "triggered": "Run created: it starts as soon as a worker is free.",
    "cancelled": "Run cancelled (a running run stops at its next heartbeat).",
    "replayed": "Replay created.",
    "notification_replayed": "Notification owed again.",
    "budget_saved": "Budget saved.",
    "followup_created": "Follow-up created.",
    "followup_exists": "A follow-up with this key and body exists already: nothing changed.",
    "followup_cancelled": "Follow-up cancelled: no further check starts.",
}


def page(
    ctx: Ctx | None, title: str, body: Markup, *, status: int = 200, heading: object = None
) -> web.Response:
    """A whole page; ``ctx`` None for the pages before login."""
    nav = _NAV(owner=_owner_label(ctx), csrf=ctx.csrf) if ctx is not None else Markup("")
    done = ctx.request.query.get("done") if ctx is not None else None
    flash = _FLASH(kind="ok", message=DONE[done]) if done in DONE else Markup("")
    now = ctx.now.astimezone(UTC).isoformat() if ctx is not None else ""
    text = _PAGE(
        title=title, heading=title if heading is None else heading, nav=nav, flash=flash,
        body=body, now=now,
    )  # fmt: skip
    return context.html_response(text, status)


def _owner_label(ctx: Ctx) -> str:
    return f"{ctx.who.owner} (admin)" if ctx.who.admin else ctx.who.owner


def message_page(
    ctx: Ctx | None, status: int, title: str, message: str, *, back: str = "/"
) -> web.Response:
    back_text = "Back to the schedules" if back == "/" else "Back"
    body = _MESSAGE(message=message, back=back, back_text=back_text)
    return page(ctx, title, body, status=status)


def not_found(ctx: Ctx | None) -> web.Response:
    return message_page(ctx, 404, "Not found", "There is no such page, schedule or run here.")


def action(
    ctx: Ctx,
    path: str,
    label: str,
    *,
    confirm: str,
    fields: Mapping[str, str] | None = None,
    extra: Markup | None = None,
    cls: str = "button",
) -> Markup:
    """A button that POSTs to ``path`` with the CSRF token. The server asks to confirm
    unless the form says ``confirmed``; the script asks in a dialog instead."""
    hidden = join(_HIDDEN(name=k, value=v) for k, v in (fields or {}).items())
    return _ACTION(
        action=path, confirm=confirm, csrf=ctx.csrf, fields=hidden + (extra or ""),
        cls=cls, label=label,
    )  # fmt: skip


def hidden(name: str, value: str) -> Markup:
    return _HIDDEN(name=name, value=value)


def badge(status: str, text: str | None = None) -> Markup:
    return _BADGE(status=status, text=text or status.replace("_", " "))


def link(href: str, text: object) -> Markup:
    return _LINK(href=href, text=text)


def table(head: Sequence[str], rows: Iterable[Sequence[object]], *, cls: str = "grid") -> Markup:
    """A table; each cell is escaped unless it is Markup."""
    body = join(_ROW(cells=join(_CELL(value=c) for c in row)) for row in rows)
    return _TABLE(cls=cls, head=join(_TH(value=h) for h in head), rows=body)


def confirm_page(ctx: Ctx, title: str, question: str, form: Markup, back: str) -> web.Response:
    """Without the script, a state change asks here first (the form posts ``confirmed``)."""
    body = Template('<p class="lead">$question</p>\n<div class="actions">$form $back</div>')(
        question=question, form=form, back=link(back, "No, go back")
    )
    return page(ctx, title, body)


def redirect_to_login(request: web.Request) -> web.Response:
    """No session (or a revoked token): to the login page; nothing was changed."""
    return context.redirect("/login")
