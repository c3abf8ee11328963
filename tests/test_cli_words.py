"""The command line says what is true: bare ``promptsched`` lists the commands, the everyday
commands' ``--help`` describes them with an example and every field explained, and a trigger
or a watch with no replica to run it says so (a watch still waits when asked)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import asyncpg
import pytest

from promptsched import config as configuration
from promptsched.cli import build_parser, completion, helptext
from promptsched.clock import Clock
from promptsched.executors import template
from tests import factories
from tests.helpers import run_cli, wait_until
from tests.test_fleet import _presence, _published


def test_bare_promptsched_lists_the_commands() -> None:
    done = run_cli()
    assert done.returncode == 2
    for command in ("run", "schedules", "runs", "preview", "tokens", "status", "doctor"):
        assert f"\n  {command} " in done.stderr, done.stderr
    assert "manage schedules" in done.stderr
    group = run_cli("schedules")
    assert group.returncode == 2
    assert "\n  add " in group.stderr and "create a schedule" in group.stderr, group.stderr


def _command(path: str) -> Any:
    parser = build_parser()
    for name in path.split():
        parser = completion.subcommands(parser)[name]
    return parser


@pytest.mark.parametrize("path", sorted(helptext.EVERYDAY))
def test_everyday_help_has_a_description_an_example_and_every_field_explained(
    path: str,
) -> None:
    parser = _command(path)
    text = parser.format_help()
    description, example = helptext.EVERYDAY[path]
    assert description.split()[0] in text and "\nexample:\n  promptsched " in text, text
    unexplained = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
    assert unexplained == [], f"promptsched {path}: {unexplained} have no help"


def test_schedules_add_help_lists_the_template_variables() -> None:
    done = run_cli("schedules", "add", "--help")
    assert done.returncode == 0
    for name in template.VARIABLES:
        assert f"{{{{ {name} }}}}" in done.stdout, name


def _watch_while_cancelled(dsn: str, run_id: int) -> tuple[str, str, int]:
    """``runs watch ID --wait`` in its own process, the run cancelled once it watches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    with subprocess.Popen(
        [sys.executable, "-m", "promptsched", "runs", "watch", str(run_id), "--wait"],
        env={**env, "PROMPTSCHED_DATABASE_URL": dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as waiting:
        assert waiting.stdout is not None
        first = waiting.stdout.readline()  # it says it watches once it is subscribed
        assert run_cli("runs", "cancel", str(run_id), dsn=dsn).returncode == 0
        out, err = waiting.communicate(timeout=30)
    return first + out, err, waiting.returncode


async def test_trigger_and_watch_with_no_replica_say_so_and_watch_waits_if_asked(
    pool: asyncpg.Pool[Any], dsn: str
) -> None:
    sid = await factories.schedule(pool, name="digest")
    triggered = run_cli("schedules", "trigger", "digest", dsn=dsn)
    assert triggered.returncode == 0, triggered.stderr
    run_id = await pool.fetchval("SELECT max(id) FROM runs WHERE schedule_id = $1", sid)
    assert (
        f"promptsched: warning: no replica is running the worker role: run {run_id} waits as "
        "pending until one starts (promptsched run)"
    ) in triggered.stderr, triggered.stderr

    watched = run_cli("runs", "watch", str(run_id), dsn=dsn, timeout=30)
    assert watched.returncode == 1
    assert "no replica is running the worker role" in watched.stderr
    assert "--wait watches it anyway" in watched.stderr

    # Asked to wait, it waits: until the run ends (here, cancelled)
    out, err, code = _watch_while_cancelled(dsn, run_id)
    assert code == 1
    assert out.startswith(f"watching run {run_id} (pending)"), (out, err)
    assert f"run {run_id} cancelled" in out, (out, err)

    # With a replica running the worker role, neither says a word about it
    presence = _presence(pool, Clock(), "r1", _published(roles=configuration.ROLES))
    await presence.run_once()

    async def published() -> bool:
        return bool(await pool.fetchval("SELECT count(*) FROM replicas"))

    await wait_until(published, timeout=5, what="the replica's row")
    again = run_cli("schedules", "trigger", "digest", dsn=dsn)
    assert again.returncode == 0 and "no replica" not in again.stderr, again.stderr
