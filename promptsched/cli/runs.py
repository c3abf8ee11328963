"""``promptsched runs ...``: list, show (with attempts), replay a dead run, cancel."""

from __future__ import annotations

import argparse
import json
from typing import Any

import asyncpg

from promptsched import config as configuration
from promptsched import service
from promptsched.api import schemas, views
from promptsched.cli.common import db_command, details, table
from promptsched.clock import Clock
from promptsched.errors import ValidationError
from promptsched.store import queries

CLI_ACTOR = "cli"
_COLUMNS = (
    ("ID", "id", 8),
    ("SCHEDULE", "schedule_id", 8),
    ("SLOT", "slot", 32),
    ("ORIGIN", "origin", 8),
    ("STATUS", "status", 9),
    ("ATT", "attempts", 3),
    ("DETAIL", "detail", 0),
)
_ATTEMPT_COLUMNS = (
    ("#", "number", 3),
    ("STATUS", "status", 9),
    ("WORKER", "worker_id", 24),
    ("STARTED", "started_at", 32),
    ("ERROR", "error", 0),
)


def cmd_list(args: argparse.Namespace, config: configuration.Config) -> int:
    if not 1 <= args.limit <= 10_000:
        raise ValidationError("--limit", "must be between 1 and 10000")

    async def main(conn: asyncpg.Connection[Any]) -> int:
        rows = await queries.run_list(
            conn,
            schedule_id=args.schedule,
            status=args.status,
            owner=None,
            before_id=None,
            limit=args.limit,
        )
        data = [service.run_json(row) for row in rows]
        if args.json:
            print(json.dumps(data))
            return 0
        table([{**run, "detail": run["skip_reason"] or run["error"]} for run in data], _COLUMNS)
        return 0

    return db_command(config, main)


def _show(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(data))
        return
    fields = [k for k in data if k not in ("output", "attempt_history", "notifications")]
    details(data, fields)
    print("\nattempts:")
    table(data["attempt_history"], _ATTEMPT_COLUMNS)
    if data["output"] is not None:
        print("\noutput:")
        print(data["output"])


def cmd_show(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        _show(await views.load_run(conn, args.id, None), args.json)
        return 0

    return db_command(config, main)


def cmd_replay(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        row = await service.replay_run(conn, Clock(), args.id, owner=None, actor=CLI_ACTOR)
        data = await views.load_run(conn, row["id"], None)
        if args.json:
            print(json.dumps(data))
        else:
            print(f"replayed run {args.id} as run {data['id']} ({data['status']})")
        return 0

    return db_command(config, main)


def cmd_cancel(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        row = await service.cancel_run(conn, Clock(), args.id, owner=None, actor=CLI_ACTOR)
        data = await views.load_run(conn, row["id"], None)
        if args.json:
            print(json.dumps(data))
        elif data["status"] == "running":
            print(f"asked run {args.id} to stop: its worker stops it at the next heartbeat")
        else:
            print(f"run {args.id} is {data['status']}")
        return 0

    return db_command(config, main)


def register(sub: Any) -> None:
    runs = sub.add_parser("runs", help="inspect runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_sub.add_parser("list", help="list runs, newest first")
    runs_list.add_argument("--schedule", type=int)
    runs_list.add_argument("--status", choices=schemas.RUN_STATUSES)
    runs_list.add_argument("--limit", type=int, default=100)
    runs_list.add_argument("--json", action="store_true")
    runs_list.set_defaults(func=cmd_list)
    for name, func, help_text in (
        ("show", cmd_show, "one run with its attempts and output"),
        ("replay", cmd_replay, "run a dead run's slot again (a new run, origin replay)"),
        ("cancel", cmd_cancel, "cancel a pending run, or ask a running one to stop"),
    ):
        cmd = runs_sub.add_parser(name, help=help_text)
        cmd.add_argument("id", type=int)
        cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(func=func)
