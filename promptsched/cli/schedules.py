"""``promptsched schedules ...``: add, list, show, pause, resume, trigger, delete, backfill."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import asyncpg
import structlog

from promptsched import config as configuration
from promptsched import service
from promptsched.api import views
from promptsched.cli.common import db_command, details, instant, table
from promptsched.clock import Clock
from promptsched.errors import ValidationError
from promptsched.store import queries
from promptsched.tools.base import Catalog

CLI_ACTOR = "cli"
_COLUMNS = (
    ("ID", "id", 6),
    ("NAME", "name", 24),
    ("KIND", "kind", 5),
    ("EXPRESSION", "expression", 22),
    ("TZ", "timezone", 16),
    ("STATE", "state", 8),
    ("NEXT FIRE", "next_fire_at", 0),
)


def _params(pairs: Sequence[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValidationError("--param", f"expected KEY=VALUE, got {pair!r}")
        params[key] = value
    return params


def _tool_catalog(config: configuration.Config, params: dict[str, str]) -> Catalog | None:
    """This server's tools, asked for only when the schedule lists some (MCP servers are
    started once to list theirs)."""
    if "tools" not in params:
        return None
    from promptsched.tools import registry
    from promptsched.tools.settings import parse_mcp_servers

    tools = registry.ToolRegistry.from_settings(
        allow=config.tools_allow,
        mcp=parse_mcp_servers(config.mcp_servers, config.mcp_raw),
    )
    previous = structlog.get_config()
    # A server that fails says so on stderr: stdout carries the command's (JSON) output.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )
    try:
        return anyio.run(registry.discover, tools)
    finally:
        structlog.configure(**previous)


def cmd_add(args: argparse.Namespace, config: configuration.Config) -> int:
    from promptsched.executors.settings import parse_providers

    raw: dict[str, Any] = {
        "name": args.name,
        "prompt": args.prompt,
        "timezone": args.tz,
        "provider": args.provider,
        "model": args.model,
        "params": _params(args.param),
        "misfire": args.misfire,
        "overlap": args.overlap,
        "max_attempts": args.max_attempts,
        "timeout": args.timeout,
        "jitter": args.jitter,
        "pause_after_failures": args.pause_after_failures,
        "cron": args.cron,
        "rrule": args.rrule,
        "at": args.at,
        "every": args.every,
    }
    providers = parse_providers(config.env, config.providers_raw)
    values = service.validate(
        {k: v for k, v in raw.items() if v is not None},
        providers=list(providers),
        provider_kinds={name: provider.kind for name, provider in providers.items()},
        webhook_allow=config.webhook_allow,
        tools=_tool_catalog(config, raw["params"]),
    )

    async def main(conn: asyncpg.Connection[Any]) -> int:
        async with conn.transaction():
            row = await service.create_schedule(conn, Clock(), values, owner=args.owner)
        data = service.schedule_json(row)
        if args.json:
            print(json.dumps(data))
        else:
            print(
                f"created schedule {data['id']} {data['name']!r}: {data['kind']} "
                f"{data['expression']} ({data['timezone']}), next fire {data['next_fire_at']}"
            )
        return 0

    return db_command(config, main, migrate_first=True)


def _state(data: dict[str, Any]) -> str:
    return "enabled" if data["enabled"] else "paused"


def _one_line(data: dict[str, Any]) -> str:
    state = "enabled" if data["enabled"] else f"paused ({data.get('pause_reason') or 'by hand'})"
    return (
        f"{data['id']:>6}  {data['name']!r}  {data['kind']} {data['expression']!r} "
        f"{data['timezone']}  {state}  next: {data['next_fire_at']}"
    )


def _schedule_command(
    config: configuration.Config,
    args: argparse.Namespace,
    action: Callable[[asyncpg.Connection[Any]], Awaitable[asyncpg.Record]],
    *,
    full: bool = False,
) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        data = views.schedule(await action(conn), with_next=True)
        if args.json:
            print(json.dumps(data))
        elif full:
            details({**data, "next_fire_times": ", ".join(data["next_fire_times"]) or None})
        else:
            print(_one_line(data))
        return 0

    return db_command(config, main)


def cmd_pause(args: argparse.Namespace, config: configuration.Config) -> int:
    until = instant(args.until, "--until") if args.until else None
    return _schedule_command(
        config,
        args,
        lambda conn: service.pause_schedule(
            conn, args.id, owner=None, actor=CLI_ACTOR, until=until, reason=args.reason
        ),
    )


def cmd_resume(args: argparse.Namespace, config: configuration.Config) -> int:
    return _schedule_command(
        config,
        args,
        lambda conn: service.resume_schedule(conn, args.id, owner=None, actor=CLI_ACTOR),
    )


def cmd_show(args: argparse.Namespace, config: configuration.Config) -> int:
    async def get(conn: asyncpg.Connection[Any]) -> asyncpg.Record:
        row = await queries.schedule_get(conn, args.id, None)
        if row is None:
            raise service.NotFound("schedule", args.id)
        return row

    return _schedule_command(config, args, get, full=True)


def cmd_list(args: argparse.Namespace, config: configuration.Config) -> int:
    if not 1 <= args.limit <= 10_000:
        raise ValidationError("--limit", "must be between 1 and 10000")

    async def main(conn: asyncpg.Connection[Any]) -> int:
        rows = await queries.schedule_search(
            conn, owner=args.owner, enabled=None, name=args.name, after_id=0, limit=args.limit
        )
        data = [views.schedule(row) for row in rows]
        if args.json:
            print(json.dumps(data))
        else:
            table([{**item, "state": _state(item)} for item in data], _COLUMNS)
        return 0

    return db_command(config, main)


def cmd_trigger(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        run = await service.trigger_schedule(conn, Clock(), args.id, owner=None, actor=CLI_ACTOR)
        data = service.run_json(run)
        print(json.dumps(data) if args.json else f"triggered run {data['id']}")
        return 0

    return db_command(config, main)


def cmd_backfill(args: argparse.Namespace, config: configuration.Config) -> int:
    start, end = instant(args.start, "--start"), instant(args.end, "--end")

    async def main(conn: asyncpg.Connection[Any]) -> int:
        runs = await service.backfill_schedule(
            conn, Clock(), args.id, start, end, owner=None, actor=CLI_ACTOR
        )
        slots = [run["slot"].isoformat() for run in runs]
        print(
            json.dumps({"created": len(slots), "slots": slots})
            if args.json
            else f"created {len(slots)} backfill runs"
        )
        return 0

    return db_command(config, main)


def cmd_delete(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        await service.delete_schedule(conn, args.id, owner=None, actor=CLI_ACTOR)
        print(json.dumps({"deleted": args.id}) if args.json else f"deleted schedule {args.id}")
        return 0

    return db_command(config, main)


def _register_add(schedules_sub: Any) -> None:
    add = schedules_sub.add_parser("add", help="create a schedule")
    add.add_argument("--name", required=True)
    kind = add.add_mutually_exclusive_group(required=True)
    kind.add_argument("--cron", help="5-field, or 6-field with seconds first")
    kind.add_argument("--rrule", help="RFC 5545 RRULE (with DTSTART)")
    kind.add_argument("--at", help="one-shot local ISO date-time")
    kind.add_argument("--every", help="interval such as 15m")
    add.add_argument("--tz", default="UTC")
    add.add_argument("--prompt", required=True)
    add.add_argument("--provider", default="echo")
    add.add_argument("--model")
    add.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    add.add_argument("--misfire", choices=service.MISFIRE_POLICIES)
    add.add_argument("--overlap")
    add.add_argument("--max-attempts", type=int)
    add.add_argument("--timeout")
    add.add_argument("--jitter")
    add.add_argument(
        "--pause-after-failures", type=int, metavar="N", help="pause after N consecutive dead runs"
    )
    add.add_argument("--owner", default="default")
    add.add_argument("--json", action="store_true")
    add.set_defaults(func=cmd_add)


def register(sub: Any) -> None:
    schedules = sub.add_parser("schedules", help="manage schedules")
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True)
    _register_add(schedules_sub)
    for name, func, help_text in (
        ("pause", cmd_pause, "pause a schedule (optionally until an instant)"),
        ("resume", cmd_resume, "resume a paused schedule"),
        ("show", cmd_show, "show one schedule"),
        ("trigger", cmd_trigger, "run a schedule now, outside its cadence"),
        ("delete", cmd_delete, "delete a schedule and its history"),
        ("backfill", cmd_backfill, "create runs for past slots in a range"),
    ):
        cmd = schedules_sub.add_parser(name, help=help_text)
        cmd.add_argument("id", type=int)
        cmd.add_argument("--json", action="store_true")
        cmd.set_defaults(func=func)
        if name == "pause":
            cmd.add_argument("--until", help="ISO-8601 instant with offset: resume then")
            cmd.add_argument("--reason")
        if name == "backfill":
            cmd.add_argument("--start", required=True, help="ISO-8601 with offset")
            cmd.add_argument("--end", required=True, help="ISO-8601 with offset")
    listing = schedules_sub.add_parser("list", help="list schedules")
    listing.add_argument("--owner")
    listing.add_argument("--name", help="a case-insensitive substring of the name")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
