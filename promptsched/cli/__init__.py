"""The ``promptsched`` command line: run the service, migrate, and manage schedules, runs and
API tokens. Schedule, run, notification and preview commands go through the HTTP API when a
service URL and token are configured (remote mode), else through the database (direct mode)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from contextlib import nullcontext

import asyncpg

import promptsched
from promptsched import config as configuration
from promptsched import errors, logs
from promptsched.cli import (
    backend,
    budget,
    common,
    completion,
    fleet,
    followups,
    health,
    helptext,
    mcp_server,
    notifications,
    runs,
    schedules,
    server,
    tokens,
)
from promptsched.clock import Clock
from promptsched.errors import PromptschedError, SchemaMismatch, ValidationError


class _Version(argparse.Action):
    """``promptsched --version``: the version and the commit it was built from (asked of git
    only when wanted)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"promptsched {promptsched.release()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = common.Parser(
        prog="promptsched",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the release and exit")
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
    health.register(sub)
    mcp_server.register(sub)
    completion.register(sub, parser)
    remote_ok = ("schedules", "runs", "notifications", "preview", "budget", "followups")
    for name in (*remote_ok, "status", "doctor", "mcp"):
        for leaf in _leaves(sub.choices[name]):
            backend.add_remote_flags(leaf)
    for name, command in sub.choices.items():
        if name not in ("run", "completion", "healthcheck"):
            for leaf in _leaves(command):
                common.add_database_flags(leaf)
    _explain(parser, "")
    return parser


def _explain(parser: argparse.ArgumentParser, path: str) -> None:
    """Every command's help: its description and example when it is an everyday one, and
    words for the shared flags (cli/helptext.py)."""
    helptext.explain(parser, path)
    for name, child in completion.subcommands(parser).items():
        _explain(child, f"{path} {name}".strip())


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's own parser, once (an alias names the same parser)."""
    children = completion.subcommands(parser)
    if not children:
        return [parser]
    unique = {id(child): child for child in children.values()}.values()
    return [leaf for child in unique for leaf in _leaves(child)]


def _fail(message: str, code: int) -> int:
    print(f"promptsched: error: {message}", file=sys.stderr)
    return code


def _leaf(exc: BaseException) -> BaseException:
    """The error itself, out of the task groups it crossed (the service's roles run in one:
    a port in use reaches here wrapped in an ExceptionGroup)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = next((e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)),
                   exc.exceptions[0])  # fmt: skip
    return exc


def _report(exc: BaseException) -> int:
    """One line for an error a user can cause, with its exit code; anything else is a bug of
    ours and raises."""
    match exc:
        case errors.VersionConflict():  # worded as the API words it
            return _fail(f"version: {exc}", common.EXIT_OTHER)
        case ValidationError():
            return _fail(f"{exc.field}: {exc.message}", common.EXIT_BAD_INPUT)
        case SchemaMismatch():
            return _fail(str(exc), common.EXIT_SCHEMA)
        case errors.NotFound():
            return _fail(str(exc), common.EXIT_NOT_FOUND)
        case common.CliError():
            return _fail(str(exc), exc.code)
        case BrokenPipeError():
            return _quiet_stdout()
        case asyncpg.ClientConfigurationError():
            return _fail(f"{DATABASE_URL}: not a Postgres URL; write it as "
                         "postgresql://USER@HOST:5432/DATABASE", common.EXIT_BAD_INPUT)  # fmt: skip
        case OSError() if words := errors.connect_failure(exc):
            return _fail(f"cannot connect to the database ({words}): is Postgres running, "
                         f"and is {DATABASE_URL} (or --database-url) right?",
                         common.EXIT_OTHER)  # fmt: skip
        case PromptschedError() | OSError() | asyncpg.PostgresError():
            return _fail(str(exc) or type(exc).__name__, common.EXIT_OTHER)
        case KeyboardInterrupt():
            return 130
    raise exc


DATABASE_URL = configuration.env_name("database_url")


def _quiet_stdout() -> int:
    """The reader of our output went away (``| head -1``): not an error. Whatever is left in
    the buffer goes nowhere, so the exit flush cannot fail either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def main(argv: Sequence[str] | None = None, *, clock: Clock | None = None) -> int:
    """Exit codes: 0 ok, 1 other error (and a watched run that did not succeed), 2 bad input,
    3 schema mismatch, 4 not found. ``clock`` pins "now" for tests."""
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")}
    # A command's own output is its words, not log lines (`run` configures the service's).
    quiet = logs.configured("warning", "console") if args.command != "run" else nullcontext()
    try:
        with quiet:
            args.clock = clock or common.pinned_clock(os.environ)
            config = configuration.load(overrides=overrides)
            code = int(args.func(args, config))
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BaseException as exc:  # every error a user can cause becomes one line
        return _report(_leaf(exc))


if __name__ == "__main__":
    sys.exit(main())
