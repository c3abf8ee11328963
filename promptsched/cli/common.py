"""What every command shares: the database to use, running a coroutine on one connection,
CLI errors with exit codes, instants from flags, and human tables."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeAlias

import anyio
import asyncpg

from promptsched import config as configuration
from promptsched import eventloop
from promptsched.clock import Clock, FrozenClock
from promptsched.errors import ValidationError
from promptsched.human import text as human_text
from promptsched.store import embedded, migrate
from promptsched.store import pool as pools

Command: TypeAlias = "Callable[[asyncpg.Connection[Any]], Awaitable[int]]"

EXIT_OTHER, EXIT_BAD_INPUT, EXIT_SCHEMA, EXIT_NOT_FOUND = 1, 2, 3, 4
NOW_ENV = "PROMPTSCHED_CLI_NOW"


class Parser(argparse.ArgumentParser):
    """The command line's parser: a mistake is said in two lines (what is wrong, where the
    help is), not with the whole usage block; its subcommands' parsers are Parsers too."""

    def error(self, message: str) -> NoReturn:
        commands = self.commands()
        if commands and "required: " in message and "COMMAND" in _plain(message):
            width = max(len(name) for name, _ in commands)
            listed = "".join(f"  {name.ljust(width)}  {words}\n" for name, words in commands)
            self.exit(
                EXIT_BAD_INPUT,
                f"usage: {self.prog} COMMAND ...\n\ncommands:\n{listed}\n"
                f"{self.prog} COMMAND --help says what each takes\n",
            )
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {_plain(message)}\n"
                                  f"  ({self.prog} --help says what it takes)\n")  # fmt: skip

    def commands(self) -> list[tuple[str, str]]:
        """This parser's subcommands with their one-line help, in the order they were added."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return [(a.dest, a.help or "") for a in action._choices_actions]
        return []


_COMMAND = re.compile(r"\b(?:\w+_)?command\b|\{[\w,-]+\}")
_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)")


def _plain(message: str) -> str:
    """argparse's words made ours: no internal names (``notifications_command``)."""
    message = _COMMAND.sub("COMMAND", message)
    found = _CHOICE.fullmatch(message)
    if found is None:
        return message.replace("required: COMMAND", "required: COMMAND (one of the commands)")
    what, given, choices = found.groups()
    return f"{given!r} is not a {what.lower()} here; choose from {choices.replace(chr(39), '')}"


def number(what: str) -> Callable[[str], int]:
    """An argparse type for an id: a positive whole number, or a two-word error naming it."""

    def parse(text: str) -> int:
        if not text.strip().isdigit():
            raise argparse.ArgumentTypeError(f"a {what} is a number, e.g. 42; got {text[:40]!r}")
        return int(text)

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def whole(text: str) -> int:
    """An argparse type for a count: a whole number (``--limit 10``)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text[:40]!r}") from None


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def add_database_flags(parser: argparse.ArgumentParser) -> None:
    """``--database-url`` and ``--data-dir`` for commands other than ``run`` (which takes every
    setting as a flag), accepted before or after the subcommand."""
    for setting, meaning in (
        ("database_url", "the Postgres URL (default: the embedded database)"),
        ("data_dir", "the embedded database's data directory"),
    ):
        name = configuration.env_name(setting)
        parser.add_argument(
            f"--{setting.replace('_', '-')}",
            dest=f"cfg_{setting}",
            metavar=name,
            default=argparse.SUPPRESS,
            help=f"{meaning}; overrides {name}",
        )


@contextmanager
def database(
    config: configuration.Config, *, announce: bool = False, create: bool = False
) -> Iterator[str]:
    """The DSN to use: ``PROMPTSCHED_DATABASE_URL``, or the embedded server in the one data dir
    (started if needed and stopped by its last user; created only when ``create``)."""
    if config.database_url:
        yield config.database_url
        return
    default = config.data_dir == configuration.default_data_dir(config.env)
    with embedded.attach(
        config.data_dir, create=create, announce=announce, move_legacy=default, say=_say
    ) as dsn:
        yield dsn


def _say(message: str) -> None:
    print(f"promptsched: {message}", file=sys.stderr, flush=True)


def run_async(fn: Callable[[], Awaitable[int]]) -> int:
    return anyio.run(fn)


def run_service(fn: Callable[[], Awaitable[int]], loop: str) -> int:
    """``promptsched run``: on the service's event loop, ``PROMPTSCHED_EVENT_LOOP``
    (promptsched/eventloop.py)."""
    return anyio.run(fn, backend_options={"loop_factory": eventloop.factory(loop)})


async def with_conn(dsn: str, fn: Command) -> int:
    conn = await pools.connect(dsn, application_name="promptsched-cli")
    try:
        return await fn(conn)
    finally:
        await conn.close()


def db_command(config: configuration.Config, fn: Command, *, migrate_first: bool = False) -> int:
    """Run ``fn`` on one connection to a database whose schema is current."""
    with database(config, create=migrate_first) as dsn:

        async def main(conn: asyncpg.Connection[Any]) -> int:
            if migrate_first:
                await migrate.apply(conn)
            await migrate.check(conn)
            return await fn(conn)

        return run_async(lambda: with_conn(dsn, main))


def now_of(args: argparse.Namespace) -> datetime:
    """The renderer's now: the injected clock's instant, else this machine's. Only for
    showing distances ("in 3 min"): no decision is taken on it, and in remote mode the
    database's clock is not reachable."""
    clock = getattr(args, "clock", None)
    pinned = clock.sql_now() if clock is not None else None
    return pinned or datetime.now(UTC)


def pinned_clock(env: Mapping[str, str]) -> Clock | None:
    """``PROMPTSCHED_CLI_NOW`` (an ISO instant with offset) pins the command's "now", as
    ``main(clock=...)`` does in-process: for tests and reproducible examples of output, so a
    real process prints the same distances ("in 3 min") every time."""
    text = env.get(NOW_ENV)
    if not text:
        return None
    return FrozenClock(instant(text, NOW_ENV))


def instant(text: str, flag: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(flag, f"not an ISO-8601 date-time: {text!r}") from None
    if value.tzinfo is None:
        raise ValidationError(flag, "needs a UTC offset, e.g. 2026-12-01T09:00:00+01:00 or Z")
    return value


FREE_WIDTH = 80  # the last column's characters at most


def table_text(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, int]]) -> str:
    """``rows`` under a header; each column is (title, key, widest), the last one free (at
    most ``FREE_WIDTH``). A column is as wide as its widest cell, up to ``widest``; a cell cut
    to it ends with an ellipsis, so a cut value never passes for a whole one."""
    texts = [[_cell(row.get(key)) for _, key, _ in columns] for row in rows]
    widths = []
    for i, (title, _, widest) in enumerate(columns):
        longest = max((len(cells[i]) for cells in texts), default=0)
        widths.append(max(len(title), min(longest, widest or FREE_WIDTH)))
    widths[-1] = 0  # the last column is not padded
    lines = ["  ".join(title.ljust(w) for (title, _, _), w in zip(columns, widths, strict=True))]
    for cells in texts:
        clipped = [
            human_text.clip(c, w or FREE_WIDTH).ljust(w) for c, w in zip(cells, widths, strict=True)
        ]
        lines.append("  ".join(clipped))
    if not rows:
        lines.append("(none)")
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else human_text.clip(human_text.words(value), 10**6)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, int]]) -> None:
    print(table_text(rows, columns))
