"""``promptsched notifications ...``: list dead notifications and replay one."""

from __future__ import annotations

import argparse
import json
from typing import Any

import asyncpg

from promptsched import config as configuration
from promptsched import notifications
from promptsched.cli.common import EXIT_NOT_FOUND, CliError, db_command, table

_COLUMNS = (
    ("ID", "id", 8),
    ("RUN", "run_id", 8),
    ("CHANNEL", "channel", 8),
    ("EVENT", "event", 10),
    ("ATT", "attempts", 3),
    ("LAST ERROR", "last_error", 0),
)


def cmd_dead(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        data = await notifications.list_dead_notifications(conn, None, limit=args.limit)
        if args.json:
            print(json.dumps(data))
        else:
            table(data, _COLUMNS)
        return 0

    return db_command(config, main)


def cmd_replay(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        data = await notifications.replay_notification(conn, args.id, None)
        if data is None:
            raise CliError(f"notification {args.id} not found", EXIT_NOT_FOUND)
        print(json.dumps(data) if args.json else f"notification {args.id} is owed again")
        return 0

    return db_command(config, main)


def register(sub: Any) -> None:
    parser = sub.add_parser("notifications", help="dead notifications: list and replay")
    commands = parser.add_subparsers(dest="notifications_command", required=True)
    dead = commands.add_parser("dead", help="notifications that ran out of attempts")
    dead.add_argument("--limit", type=int, default=100)
    dead.add_argument("--json", action="store_true")
    dead.set_defaults(func=cmd_dead)
    replay = commands.add_parser("replay", help="owe a dead notification again")
    replay.add_argument("id", type=int)
    replay.add_argument("--json", action="store_true")
    replay.set_defaults(func=cmd_replay)
