"""``promptsched notifications ...``: list dead notifications and replay one."""

from __future__ import annotations

import argparse
import json
from typing import Any

from promptsched import config as configuration
from promptsched.cli import backend, common
from promptsched.cli.backend import Backend
from promptsched.cli.common import table
from promptsched.errors import ValidationError

_COLUMNS = (
    ("ID", "id", 8),
    ("SCHEDULE", "schedule", 20),
    ("RUN", "run_id", 8),
    ("CHANNEL", "channel", 8),
    ("EVENT", "event", 10),
    ("ATT", "attempts", 3),
    ("LAST ERROR", "last_error", 0),
)


def cmd_dead(args: argparse.Namespace, config: configuration.Config) -> int:
    if not 1 <= args.limit <= 1000:
        raise ValidationError("--limit", "must be between 1 and 1000")

    async def action(api: Backend) -> int:
        data = await api.dead_notifications(args.limit)
        if args.json:
            print(json.dumps(data))
        else:  # the schedule's name beside its id
            table([{**n, "schedule": f"#{n['schedule_id']} {n.get('schedule_name') or ''}"}
                   for n in data], _COLUMNS)  # fmt: skip
        return 0

    return backend.run(args, config, action)


def cmd_replay(args: argparse.Namespace, config: configuration.Config) -> int:
    async def action(api: Backend) -> int:
        data = await api.replay_notification(args.id)
        print(json.dumps(data) if args.json else f"notification {args.id} is owed again")
        return 0

    return backend.run(args, config, action)


def register(sub: Any) -> None:
    parser = sub.add_parser("notifications", help="dead notifications: list and replay")
    commands = parser.add_subparsers(dest="notifications_command", required=True)
    dead = commands.add_parser(
        "list", aliases=["dead"], help="dead notifications: those that ran out of attempts"
    )
    dead.add_argument("--limit", type=common.whole, default=100)
    dead.add_argument("--json", action="store_true")
    dead.set_defaults(func=cmd_dead)
    replay = commands.add_parser("replay", help="owe a dead notification again")
    replay.add_argument("id", type=common.number("notification id"))
    replay.add_argument("--json", action="store_true")
    replay.set_defaults(func=cmd_replay)
