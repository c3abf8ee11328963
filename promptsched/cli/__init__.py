"""The ``promptsched`` command line: run the service, migrate, and manage schedules, runs and
API tokens. Schedule, run, notification and preview commands go through the HTTP API when a
service URL and token are configured (remote mode), else through the database (direct mode)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import asyncpg

from promptsched import config as configuration
from promptsched import errors
from promptsched.cli import (
    backend,
    budget,
    common,
    completion,
    fleet,
    followups,
    notifications,
    runs,
    schedules,
    server,
    tokens,
)
from promptsched.clock import Clock
from promptsched.errors import PromptschedError, SchemaMismatch, ValidationError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="promptsched",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    backend.add_remote_flags(parser)
    common.add_database_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    server.register(sub)
    schedules.register(sub)
    server.register_preview(sub)
    runs.register(sub)
    notifications.register(sub)
    budget.register(sub)
    followups.register(sub)
    tokens.register(sub)
    fleet.register(sub)
    completion.register(sub, parser)
    remote_ok = ("schedules", "runs", "notifications", "preview", "budget", "followups")
    for name in (*remote_ok, "status", "doctor"):
        for leaf in _leaves(sub.choices[name]):
            backend.add_remote_flags(leaf)
    for name, command in sub.choices.items():
        if name not in ("run", "completion"):
            for leaf in _leaves(command):
                common.add_database_flags(leaf)
    return parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    children = completion.subcommands(parser)
    if not children:
        return [parser]
    return [leaf for child in children.values() for leaf in _leaves(child)]


def _fail(message: str, code: int) -> int:
    print(f"promptsched: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None, *, clock: Clock | None = None) -> int:
    """Exit codes: 0 ok, 1 other error (and a watched run that did not succeed), 2 bad input,
    3 schema mismatch, 4 not found. ``clock`` pins "now" for tests."""
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")}
    try:
        args.clock = clock or common.pinned_clock(os.environ)
        config = configuration.load(overrides=overrides)
        return int(args.func(args, config))
    except errors.VersionConflict as exc:  # worded as the API words it
        return _fail(f"version: {exc}", common.EXIT_OTHER)
    except ValidationError as exc:
        return _fail(f"{exc.field}: {exc.message}", common.EXIT_BAD_INPUT)
    except SchemaMismatch as exc:
        return _fail(str(exc), common.EXIT_SCHEMA)
    except errors.NotFound as exc:
        return _fail(str(exc), common.EXIT_NOT_FOUND)
    except common.CliError as exc:
        return _fail(str(exc), exc.code)
    except (PromptschedError, OSError, asyncpg.PostgresError) as exc:
        return _fail(str(exc), common.EXIT_OTHER)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
