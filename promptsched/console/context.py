"""One console request once its session is checked: who asks, their CSRF token, the
database's now, and the submitted form; plus the replies pages give."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from promptsched.web import auth
from promptsched.web.deps import Deps


class Forbidden(Exception):
    """A state-changing request without the right CSRF token."""


@dataclass(frozen=True, slots=True)
class Ctx:
    request: web.Request
    deps: Deps
    who: auth.Principal
    csrf: str
    now: datetime  # the database's clock, for relative times
    form: MultiDictProxy[Any] | None = None

    @property
    def scope(self) -> str | None:
        """The owner filter: None (every owner) for an admin token."""
        return self.who.scope

    def field(self, name: str, default: str = "") -> str:
        """A submitted form field as text (a file upload counts as absent)."""
        value = self.form.get(name) if self.form is not None else None
        return value if isinstance(value, str) else default

    def query(self, name: str) -> str | None:
        value = self.request.query.get(name)
        return value if value else None

    def int_query(self, name: str) -> int | None:
        """A positive id from the query string; None for anything else (never an error)."""
        value = self.query(name)
        if value is None or not value.isascii() or not value.isdigit() or len(value) > 18:
            return None
        return int(value)

    def path_id(self) -> int:
        """The ``{id}`` of the path; a non-number is a 404, like an unknown id."""
        raw = self.request.match_info.get("id", "")
        if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
            raise NotFoundPage()
        return int(raw)


class NotFoundPage(Exception):
    """Answer the console's 404 page."""


def redirect(location: str) -> web.Response:
    """See other: the answer to every successful form POST (post/redirect/get)."""
    return web.Response(status=303, headers={"Location": location})


def html_response(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body,
        status=status,
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )
