"""Bearer tokens: minting (shown once, stored as a sha256 hash), checking, and the principal
(an owner, or an admin who sees every owner) each request acts as; the console's sessions,
started with a token and ended by logging out."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
from aiohttp import web

from promptsched.clock import Clock
from promptsched.errors import ValidationError
from promptsched.store import queries

PREFIX = "pst_"
SESSION_PREFIX = "pss_"
# A console session lasts this long after its login (logging out ends it sooner).
SESSION_TTL = timedelta(days=7)
_OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")
# What a token this module minted can look like; anything else is refused without a query.
_SHAPE = re.compile(r"^[A-Za-z0-9_-]{16,200}$")
MAX_TOKEN_NAME = 200


@dataclass(frozen=True, slots=True)
class Principal:
    token_id: int
    owner: str
    admin: bool
    session_id: int | None = None  # a console session's, which logging out ends

    @property
    def scope(self) -> str | None:
        """The owner filter for queries: None (every owner) for an admin token."""
        return None if self.admin else self.owner

    @property
    def actor(self) -> str:
        """Who the change history names for a change made with this token."""
        return self.owner


def new_token() -> str:
    """A fresh token: 256 random bits, so a plain sha256 is a safe way to store it."""
    return PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_owner(owner: str, field: str = "owner") -> str:
    if not _OWNER.match(owner):
        raise ValidationError(
            field, "must be 1-100 letters, digits or . _ @ - (starting with a letter or digit)"
        )
    return owner


async def create_token(
    db: queries.DB, *, owner: str, admin: bool = False, name: str | None = None
) -> tuple[str, asyncpg.Record]:
    """Mint a token for ``owner``; returns the token (to show once) and its stored row."""
    check_owner(owner)
    if name is not None and (len(name) > MAX_TOKEN_NAME or "\x00" in name):
        raise ValidationError("name", f"must be at most {MAX_TOKEN_NAME} characters, without NUL")
    token = new_token()
    row = await queries.token_insert(db, owner, admin, token_hash(token), name)
    return token, row


def bearer(request: web.Request) -> str | None:
    """The token in ``Authorization: Bearer TOKEN``, if it has a plausible shape."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _SHAPE.match(token):
        return None
    return token


async def authenticate(request: web.Request, db: queries.DB, clock: Clock) -> Principal | None:
    """The principal of the request's token; None when it is missing, unknown or revoked."""
    return await authenticate_token(bearer(request), db, clock)


async def authenticate_token(token: str | None, db: queries.DB, clock: Clock) -> Principal | None:
    """The principal of a token however it came (a bearer header, the console's session
    cookie); None when it is missing, malformed, unknown or revoked."""
    if token is None or not _SHAPE.match(token):
        return None
    row: Any = await queries.token_authenticate(db, token_hash(token), clock.sql_now())
    if row is None:
        return None
    return Principal(token_id=row["id"], owner=row["owner"], admin=row["admin"])


async def start_session(db: queries.DB, who: Principal, clock: Clock) -> str | None:
    """A new console session of ``who``'s token: the secret for its cookie (only its sha256 is
    stored), or None when the token was revoked meanwhile."""
    secret = SESSION_PREFIX + secrets.token_urlsafe(32)
    started = await queries.console_session_start(
        db, token_hash(secret), who.token_id, SESSION_TTL, clock.sql_now()
    )
    return secret if started is not None else None


async def authenticate_session(
    secret: str | None, db: queries.DB, clock: Clock
) -> Principal | None:
    """The principal of a console session's cookie; None when it is missing, malformed, ended,
    expired, or its token was revoked."""
    if secret is None or not secret.startswith(SESSION_PREFIX) or not _SHAPE.match(secret):
        return None
    row = await queries.console_session_authenticate(db, token_hash(secret), clock.sql_now())
    if row is None:
        return None
    return Principal(
        token_id=row["id"], owner=row["owner"], admin=row["admin"], session_id=row["session_id"]
    )


async def end_session(secret: str | None, db: queries.DB, clock: Clock) -> None:
    """Log out: the session ends at once, and its open streams within a second or so."""
    if secret is not None and _SHAPE.match(secret):
        await queries.console_session_end(db, token_hash(secret), clock.sql_now())
