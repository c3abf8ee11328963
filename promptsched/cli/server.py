"""Commands that need no schedule: run the service, migrate, and preview an expression."""

from __future__ import annotations

import argparse
import json
import socket
from datetime import datetime
from typing import Any

import anyio
import asyncpg

from promptsched import config as configuration
from promptsched import logs
from promptsched.api import app as api_app
from promptsched.cli import backend, common, direct, remote
from promptsched.cli.common import database, instant, run_async, run_service, with_conn
from promptsched.clock import Clock
from promptsched.errors import ValidationError
from promptsched.human import describe, times
from promptsched.store import migrate


def cmd_run(args: argparse.Namespace, config: configuration.Config) -> int:
    from promptsched.supervisor import Supervisor

    logs.configure(config.log_level, config.resolved_log_format())
    if "api" in config.roles and config.http_port:
        _check_port(config.http_host, config.http_port)
    with database(config, announce=True, create=True) as dsn:

        async def main() -> int:
            await Supervisor(config, dsn).run()
            return 0

        return run_service(main, config.event_loop)


def _check_port(host: str, port: int) -> None:
    """Say at once, before the database starts, that the API's port is taken (the real bind
    says the same if it is taken meanwhile)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return  # the bind names a bad host itself
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise api_app.listen_error(host, port, exc) from None


def cmd_migrate(args: argparse.Namespace, config: configuration.Config) -> int:
    """Online: each migration in its own transaction(s), waiting at most ``--lock-timeout``
    for a table's lock and trying again after a backoff (docs/deploying.md, "Upgrading")."""
    if not 0 < args.lock_timeout <= 60:
        raise ValidationError("--lock-timeout", "must be more than 0 and at most 60 seconds")

    async def main(conn: asyncpg.Connection[Any]) -> int:
        if args.plan:
            indexes = await migrate.index_tables(conn)
            for line in migrate.plan(await migrate.pending(conn), indexes):
                print(line)
            return 0
        options = migrate.Options(
            lock_timeout=args.lock_timeout, say=lambda line: print(line, flush=True)
        )
        applied = await migrate.apply(conn, options=options)
        print(f"applied migrations {applied}" if applied else "schema is up to date")
        return 0

    with database(config, create=True) as dsn:
        # Over the direct URL when the main one is a transaction pooler: a step outside a
        # transaction (CREATE INDEX CONCURRENTLY) holds a session lock.
        direct = config.database.direct_url or dsn
        return run_async(lambda: with_conn(direct, main))


def cmd_preview(args: argparse.Namespace, config: configuration.Config) -> int:
    """Direct mode needs no database: the preview is pure schedule math, the scheduler's own
    code path. Remote mode asks the service (its version of that code)."""
    if not 1 <= args.count <= 1000:
        raise ValidationError("--count", "must be between 1 and 1000")
    if args.start:
        instant(args.start, "--from")
    query = {"expression": args.expression, "timezone": args.tz, "count": args.count,
             "from": args.start, "dst_gap": args.dst_gap, "dst_fold": args.dst_fold}  # fmt: skip
    where = backend.remote_target(args, config)
    if where is None:
        data = direct.preview_locally(query, getattr(args, "clock", None) or Clock())
    else:
        target = where

        async def ask() -> dict[str, Any]:
            async with remote.RemoteBackend(target) as api:
                return await api.preview(query)

        data = anyio.run(ask)
    if args.json:
        print(json.dumps(data))
        return 0
    print(preview_text(data, common.now_of(args)))
    return 0


def preview_text(data: dict[str, Any], now: datetime) -> str:
    """The expression in words, then each fire time in its zone, in UTC, and from now."""
    zone = data["timezone"]
    words = describe.describe(data["kind"], data["expression"])
    said = f" ({words})" if words != data["expression"] else ""
    lines = [f"{data['kind']} {data['expression']}{said}, in {zone}:"]
    utc = [times.instant(row["utc"]) for row in data["fire_times"]]
    seconds = times.any_seconds(utc)
    for fire in utc:
        assert fire is not None
        local = times.local(fire, zone, seconds=seconds)
        also = "" if zone == "UTC" else f"   {times.local(fire, 'UTC', seconds=seconds)}"
        lines.append(f"  {local}{also}   {times.relative(fire, now)}")
    if not utc:
        lines.append("  (no more fire times)")
    return "\n".join(lines)


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    for setting in configuration.SETTINGS:
        parser.add_argument(
            f"--{setting.replace('_', '-')}",
            dest=f"cfg_{setting}",
            metavar=configuration.env_name(setting),
            help=f"overrides {configuration.env_name(setting)}",
        )


def register(sub: Any) -> None:
    run = sub.add_parser("run", help="run the service (scheduler, workers, reaper, API)")
    _add_run_flags(run)
    run.set_defaults(func=cmd_run)
    mig = sub.add_parser("migrate", help="apply database migrations (online; first, before a roll)")
    mig.add_argument(
        "--plan", action="store_true", help="list the pending migrations and the locks each takes"
    )
    mig.add_argument(
        "--lock-timeout", type=float, default=migrate.LOCK_TIMEOUT, metavar="SECONDS",
        help="how long a statement waits for a table's lock before backing off (default 1)",
    )  # fmt: skip
    mig.set_defaults(func=cmd_migrate)


def register_preview(sub: Any) -> None:
    preview = sub.add_parser("preview", help="the next fire times of an expression")
    preview.add_argument("expression", help="cron line, @macro, RRULE, 'every 15m' or 'at ISO'")
    preview.add_argument("--tz", default="UTC")
    preview.add_argument("--from", dest="start", help="ISO-8601 instant (default: now)")
    preview.add_argument("--count", type=common.whole, default=10)
    preview.add_argument("--dst-gap", default="shift", choices=("shift", "skip"))
    preview.add_argument("--dst-fold", default="first", choices=("first", "both"))
    preview.add_argument("--json", action="store_true")
    preview.set_defaults(func=cmd_preview)
