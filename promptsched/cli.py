"""The ``promptsched`` command line: run the service, migrate, and manage schedules and runs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import asyncpg

from promptsched import config as configuration
from promptsched import logs, service
from promptsched.clock import Clock
from promptsched.errors import PromptschedError, SchemaMismatch, ValidationError
from promptsched.schedule import spec
from promptsched.store import migrate, queries
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres


class CliError(Exception):
    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@contextmanager
def database(config: configuration.Config, *, announce: bool = False) -> Iterator[str]:
    """The DSN to use: ``PROMPTSCHED_DATABASE_URL``, or the embedded server in the data dir
    (started if needed, and stopped again on exit by whoever started it)."""
    if config.database_url:
        yield config.database_url
        return
    server = EmbeddedPostgres(config.data_dir)
    started = server.ensure_running()
    if announce:
        print(
            f"promptsched: embedded Postgres in {server.data_dir} ({server.dsn()})",
            file=sys.stderr,
            flush=True,
        )
    try:
        yield server.dsn()
    finally:
        if started:
            server.stop()


def _run_async(fn: Callable[[], Awaitable[int]]) -> int:
    return anyio.run(fn)


# --- commands ---------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace, config: configuration.Config) -> int:
    from promptsched.supervisor import Supervisor

    logs.configure(config.log_level, config.resolved_log_format())
    with database(config, announce=True) as dsn:

        async def main() -> int:
            await Supervisor(config, dsn).run()
            return 0

        return _run_async(main)


async def _with_conn(dsn: str, fn: Callable[[asyncpg.Connection[Any]], Awaitable[int]]) -> int:
    conn = await pools.connect(dsn, application_name="promptsched-cli")
    try:
        return await fn(conn)
    finally:
        await conn.close()


def _db_command(
    config: configuration.Config,
    fn: Callable[[asyncpg.Connection[Any]], Awaitable[int]],
    *,
    migrate_first: bool = False,
) -> int:
    with database(config) as dsn:

        async def main(conn: asyncpg.Connection[Any]) -> int:
            if migrate_first:
                await migrate.apply(conn)
            await migrate.check(conn)
            return await fn(conn)

        return _run_async(lambda: _with_conn(dsn, main))


def cmd_migrate(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        applied = await migrate.apply(conn)
        print(f"applied migrations {applied}" if applied else "schema is up to date")
        return 0

    with database(config) as dsn:
        return _run_async(lambda: _with_conn(dsn, main))


def _params(pairs: Sequence[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValidationError("--param", f"expected KEY=VALUE, got {pair!r}")
        params[key] = value
    return params


def cmd_schedules_add(args: argparse.Namespace, config: configuration.Config) -> int:
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
        "cron": args.cron,
        "rrule": args.rrule,
        "at": args.at,
        "every": args.every,
    }
    providers = parse_providers(config.env, config.providers_raw)
    values = service.validate(
        {k: v for k, v in raw.items() if v is not None}, providers=list(providers)
    )

    async def main(conn: asyncpg.Connection[Any]) -> int:
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

    return _db_command(config, main, migrate_first=True)


def cmd_runs_list(args: argparse.Namespace, config: configuration.Config) -> int:
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
        print(f"{'ID':>8} {'SCHEDULE':>8} {'SLOT':<26} {'STATUS':<10} {'ATT':>3}  DETAIL")
        for run in data:
            detail = run["skip_reason"] or run["error"] or ""
            print(
                f"{run['id']:>8} {run['schedule_id']:>8} {run['slot']:<26} "
                f"{run['status']:<10} {run['attempts']:>3}  {detail[:60]}"
            )
        return 0

    return _db_command(config, main)


def _print_schedule(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(data))
        return
    state = "enabled" if data["enabled"] else f"paused ({data.get('pause_reason') or 'by hand'})"
    print(
        f"{data['id']:>6}  {data['name']!r}  {data['kind']} {data['expression']!r} "
        f"{data['timezone']}  {state}  next: {data['next_fire_at']}"
    )


def _schedule_command(
    config: configuration.Config,
    args: argparse.Namespace,
    action: Callable[[asyncpg.Connection[Any]], Awaitable[asyncpg.Record]],
) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        try:
            row = await action(conn)
        except service.NotFound as exc:
            raise CliError(str(exc), 4) from None
        _print_schedule(service.schedule_json(row), args.json)
        return 0

    return _db_command(config, main)


def cmd_schedules_pause(args: argparse.Namespace, config: configuration.Config) -> int:
    until = _instant(args.until, "--until") if args.until else None
    return _schedule_command(
        config,
        args,
        lambda conn: service.pause_schedule(
            conn, args.id, owner=None, actor="cli", until=until, reason=args.reason
        ),
    )


def cmd_schedules_resume(args: argparse.Namespace, config: configuration.Config) -> int:
    return _schedule_command(
        config, args, lambda conn: service.resume_schedule(conn, args.id, owner=None, actor="cli")
    )


def cmd_schedules_show(args: argparse.Namespace, config: configuration.Config) -> int:
    async def get(conn: asyncpg.Connection[Any]) -> asyncpg.Record:
        row = await queries.schedule_get(conn, args.id, None)
        if row is None:
            raise service.NotFound("schedule", args.id)
        return row

    return _schedule_command(config, args, get)


def cmd_schedules_list(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        rows = await queries.schedule_list(conn, args.owner, 0, args.limit)
        data = [service.schedule_json(row) for row in rows]
        if args.json:
            print(json.dumps(data))
        for item in [] if args.json else data:
            _print_schedule(item, False)
        return 0

    return _db_command(config, main)


def cmd_schedules_trigger(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        try:
            run = await service.trigger_schedule(conn, Clock(), args.id, owner=None, actor="cli")
        except service.NotFound as exc:
            raise CliError(str(exc), 4) from None
        data = service.run_json(run)
        print(json.dumps(data) if args.json else f"triggered run {data['id']}")
        return 0

    return _db_command(config, main)


def cmd_schedules_backfill(args: argparse.Namespace, config: configuration.Config) -> int:
    start, end = _instant(args.start, "--start"), _instant(args.end, "--end")

    async def main(conn: asyncpg.Connection[Any]) -> int:
        try:
            runs = await service.backfill_schedule(
                conn, Clock(), args.id, start, end, owner=None, actor="cli"
            )
        except service.NotFound as exc:
            raise CliError(str(exc), 4) from None
        slots = [run["slot"].isoformat() for run in runs]
        print(
            json.dumps({"created": len(slots), "slots": slots})
            if args.json
            else f"created {len(slots)} backfill runs"
        )
        return 0

    return _db_command(config, main)


def cmd_schedules_delete(args: argparse.Namespace, config: configuration.Config) -> int:
    async def main(conn: asyncpg.Connection[Any]) -> int:
        try:
            await service.delete_schedule(conn, args.id, owner=None, actor="cli")
        except service.NotFound as exc:
            raise CliError(str(exc), 4) from None
        print(f"deleted schedule {args.id}")
        return 0

    return _db_command(config, main)


def _instant(text: str, flag: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(flag, f"not an ISO-8601 date-time: {text!r}") from None
    if value.tzinfo is None:
        raise ValidationError(flag, "needs a UTC offset, e.g. 2026-12-01T09:00:00+01:00 or Z")
    return value


def cmd_preview(args: argparse.Namespace, config: configuration.Config) -> int:
    """Needs no database: the preview is pure schedule math, the scheduler's own code path."""
    parsed = spec.parse_line(args.expression, args.tz, dst_gap=args.dst_gap, dst_fold=args.dst_fold)
    start = _instant(args.start, "--from") if args.start else datetime.now(UTC)
    if not 1 <= args.count <= 1000:
        raise ValidationError("--count", "must be between 1 and 1000")
    zone = ZoneInfo(parsed.timezone)
    times = service.preview(parsed, start, args.count)
    rows = [
        {"local": t.astimezone(zone).isoformat(), "utc": t.astimezone(UTC).isoformat()}
        for t in times
    ]
    if args.json:
        print(
            json.dumps(
                {
                    "kind": parsed.kind,
                    "expression": parsed.expression,
                    "timezone": parsed.timezone,
                    "fire_times": rows,
                }
            )
        )
        return 0
    print(f"{parsed.kind} {parsed.expression!r} in {parsed.timezone}:")
    for row in rows:
        print(f"  {row['local']}   ({row['utc']})")
    if not rows:
        print("  (no more fire times)")
    return 0


# --- parser -----------------------------------------------------------------------------------


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    for setting in configuration.SETTINGS:
        parser.add_argument(
            f"--{setting.replace('_', '-')}",
            dest=f"cfg_{setting}",
            metavar=configuration.env_name(setting),
            help=f"overrides {configuration.env_name(setting)}",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promptsched", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the service (scheduler, workers, reaper, API)")
    _add_run_flags(run)
    run.set_defaults(func=cmd_run)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=cmd_migrate)

    schedules = sub.add_parser("schedules", help="manage schedules")
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True)
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
    add.set_defaults(func=cmd_schedules_add)

    for name, func, help_text in (
        ("pause", cmd_schedules_pause, "pause a schedule (optionally until an instant)"),
        ("resume", cmd_schedules_resume, "resume a paused schedule"),
        ("show", cmd_schedules_show, "show one schedule"),
        ("trigger", cmd_schedules_trigger, "run a schedule now, outside its cadence"),
        ("delete", cmd_schedules_delete, "delete a schedule and its history"),
        ("backfill", cmd_schedules_backfill, "create runs for past slots in a range"),
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
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_schedules_list)

    preview = sub.add_parser("preview", help="the next fire times of an expression")
    preview.add_argument("expression", help="cron line, @macro, RRULE, 'every 15m' or 'at ISO'")
    preview.add_argument("--tz", default="UTC")
    preview.add_argument("--from", dest="start", help="ISO-8601 instant (default: now)")
    preview.add_argument("--count", type=int, default=10)
    preview.add_argument("--dst-gap", default="shift", choices=("shift", "skip"))
    preview.add_argument("--dst-fold", default="first", choices=("first", "both"))
    preview.add_argument("--json", action="store_true")
    preview.set_defaults(func=cmd_preview)

    runs = sub.add_parser("runs", help="inspect runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_sub.add_parser("list", help="list runs, newest first")
    runs_list.add_argument("--schedule", type=int)
    runs_list.add_argument("--status")
    runs_list.add_argument("--limit", type=int, default=100)
    runs_list.add_argument("--json", action="store_true")
    runs_list.set_defaults(func=cmd_runs_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")}
    try:
        config = configuration.load(overrides=overrides)
        return int(args.func(args, config))
    except ValidationError as exc:
        print(f"promptsched: error: {exc.field}: {exc.message}", file=sys.stderr)
        return 2
    except SchemaMismatch as exc:
        print(f"promptsched: error: {exc}", file=sys.stderr)
        return 3
    except (PromptschedError, CliError, OSError, asyncpg.PostgresError) as exc:
        print(f"promptsched: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
