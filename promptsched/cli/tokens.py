"""``promptsched tokens ...``: create an API bearer token (shown once), list, revoke."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import asyncpg

from promptsched import config as configuration
from promptsched import errors
from promptsched.cli import common
from promptsched.cli.common import db_command, now_of, table
from promptsched.human import times
from promptsched.ops import views
from promptsched.store import queries
from promptsched.web import auth

_COLUMNS = (
    ("ID", "id", 6),
    ("OWNER", "owner", 16),
    ("ADMIN", "admin", 5),
    ("NAME", "name", 20),
    ("CREATED", "created", 44),
    ("LAST USED", "last_used", 44),
    ("REVOKED", "revoked", 0),
)
_TIMES = (("created", "created_at"), ("last_used", "last_used_at"), ("revoked", "revoked_at"))


def _json(row: asyncpg.Record) -> dict[str, Any]:
    return views.run_json(row)  # ISO instants, plain values


def cmd_create(args: argparse.Namespace, config: configuration.Config) -> int:
    auth.check_owner(args.owner, "--owner")

    async def main(conn: asyncpg.Connection[Any]) -> int:
        token, row = await auth.create_token(
            conn, owner=args.owner, admin=args.admin, name=args.name
        )
        if args.json:
            print(json.dumps({**_json(row), "token": token}))
            return 0
        print(token)  # alone on stdout, so TOKEN=$(promptsched tokens create ...) works
        kind = "admin token" if row["admin"] else "token"
        print(
            f"created {kind} {row['id']} for owner {row['owner']!r}; it is shown only now, "
            "store it safely",
            file=sys.stderr,
        )
        return 0

    return db_command(config, main, migrate_first=True)


def cmd_list(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        data = [_json(row) for row in await queries.token_list(conn, args.owner)]
        if args.json:
            print(json.dumps(data))
            return 0
        now = now_of(args)
        # A token belongs to no schedule: its times are in UTC, as the API gives them.
        table([{**token, **{shown: times.when(token[key], "UTC", now, none="never" if
                                             key == "last_used_at" else "-")
                            for shown, key in _TIMES}} for token in data], _COLUMNS)  # fmt: skip
        return 0

    return db_command(config, main)


def cmd_revoke(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        row = await queries.token_revoke(conn, args.id, None)
        if row is None:
            raise errors.NotFound("live token", args.id)
        print(json.dumps(_json(row)) if args.json else f"revoked token {args.id}")
        return 0

    return db_command(config, main)


def register(sub: Any) -> None:
    tokens = sub.add_parser("tokens", help="manage API bearer tokens")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True)
    create = tokens_sub.add_parser("create", help="create a token (printed once)")
    create.add_argument("--owner", required=True, help="the owner its requests act as")
    create.add_argument("--admin", action="store_true", help="sees and changes every owner's")
    create.add_argument("--name", help="a label, e.g. what uses the token")
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_create)
    listing = tokens_sub.add_parser("list", help="list tokens (never the tokens themselves)")
    listing.add_argument("--owner")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    revoke = tokens_sub.add_parser("revoke", help="revoke a token at once")
    revoke.add_argument("id", type=common.number("token id"))
    revoke.add_argument("--json", action="store_true")
    revoke.set_defaults(func=cmd_revoke)
