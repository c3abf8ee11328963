"""Every error a user can cause is one or two lines that say what to do: every command, run as
a real process with broken input (a flag it does not take, and a value it cannot use), fails
with a short message of ours and no traceback or library text; and the rough edges a newcomer
met: a port in use, a closed pipe, a URL with /v1, an unreachable service, an unknown provider,
`notifications list`, and `notifications replay` printing only its answer."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched import cli
from promptsched.cli import completion
from tests import factories
from tests.helpers import Service, run_cli

# What must never reach a user: a traceback, an exception's class name, a library's name or
# its wording, an errno, a Python repr of a dict, argparse's internal names or usage block.
LIBRARY = re.compile(
    r"Traceback|\b[A-Z]\w*(?:Error|Exception|Group)\b|aiohttp|asyncpg|anyio|ssl:default|"
    r"\[Errno|Connect call failed|NoneType|object has no attribute|usage:|invalid int value|"
    r"\w+_command\b|\{'|Multiple exceptions"
)
MISSING = "2026-no-such-thing"

# One broken invocation per command: input it cannot use. A new command needs its row here.
BROKEN: dict[str, tuple[str, ...]] = {
    "run": ("run", "--workers", "many"),
    "migrate": ("migrate", "--database-url", "postgresql://nobody@127.0.0.1:1/nope"),
    "schedules add": ("schedules", "add", "--name", "n", "--cron", "61 * * * *", "--prompt", "p"),
    "schedules edit": ("schedules", "edit", "1", "--cron", "every day"),
    "schedules show": ("schedules", "show", MISSING),
    "schedules pause": ("schedules", "pause", "1", "--until", "2020-01-01T00:00:00Z"),
    "schedules resume": ("schedules", "resume", "999"),
    "schedules trigger": ("schedules", "trigger", MISSING),
    "schedules delete": ("schedules", "delete", "999"),
    "schedules backfill": ("schedules", "backfill", "1", "--start", "monday", "--end", "friday"),
    "schedules history": ("schedules", "history", "1", "--limit", "0"),
    "schedules explain": ("schedules", "explain", "1", "--at", "tomorrow"),
    "schedules list": ("schedules", "list", "--limit", "lots"),
    "preview": ("preview", "61 * * * *"),
    "runs list": ("runs", "list", "--schedule", MISSING),
    "runs diff": ("runs", "diff", "1", "999"),
    "runs show": ("runs", "show", "999"),
    "runs replay": ("runs", "replay", "1"),  # succeeded: nothing to replay
    "runs cancel": ("runs", "cancel", "first"),
    "runs watch": ("runs", "watch", "999"),
    "notifications list": ("notifications", "list", "--limit", "0"),
    "notifications dead": ("notifications", "dead", "--limit", "5000"),
    "notifications replay": ("notifications", "replay", "999"),
    "budget show": ("budget", "show", "--owner", "not an owner!"),
    "budget set": ("budget", "set", "tokens/day=lots"),
    "budget clear": ("budget", "clear", "--owner", "not an owner!"),
    "followups add": ("followups", "add", "--key", "k", "--in", "soon", "--prompt", "p"),
    "followups show": ("followups", "show", "no-such-key"),
    "followups list": ("followups", "list", "--state", "lost"),
    "followups cancel": ("followups", "cancel", "not a key!"),
    "tokens create": ("tokens", "create", "--owner", ""),
    "tokens list": ("tokens", "list", "--database-url", "nonsense"),
    "tokens revoke": ("tokens", "revoke", "999"),
    "completion": ("completion", "fish"),
    "status": ("status", "--url", "ftp://nowhere.example", "--token", "pst_x"),
    "doctor": ("doctor", "--url", "ftp://nowhere.example", "--token", "pst_x"),
    "mcp": ("mcp", "--owner", "not an owner!"),
    "healthcheck": ("healthcheck", "--timeout", "soon"),
}


def _leaves() -> list[str]:
    return sorted(path.removeprefix("promptsched ") for path, children, _ in
                  completion.walk(cli.build_parser()) if not children)  # fmt: skip


def assert_short_error(done: subprocess.CompletedProcess[str], what: object) -> None:
    """Failed, said so in one or two lines of our own on stderr, and printed nothing else."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0, (what, done.stdout)
    assert not done.stdout, (what, done.stdout)
    assert 1 <= len(lines) <= 2, (what, done.stderr)
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("promptsched"), (what, done.stderr)
    assert not LIBRARY.search(done.stderr), (what, done.stderr)


@pytest.fixture
async def data(pool: asyncpg.Pool[Any]) -> None:
    """Schedule 1 and its succeeded run 1 (the commands' ids point at them or at nothing)."""
    sid = await factories.schedule(pool, name="weekly")
    run = await factories.pending_run(pool, sid)
    await pool.execute(
        "UPDATE runs SET status = 'succeeded', finished_at = now() WHERE id = $1", run
    )


def test_every_command_is_in_the_table() -> None:
    assert sorted(BROKEN) == _leaves()


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("data")
def test_every_command_with_broken_input_says_so_in_a_line_or_two(dsn: str, tmp_path: Path) -> None:
    env = {"PROMPTSCHED_DATA_DIR": str(tmp_path / "none"), "XDG_CONFIG_HOME": str(tmp_path)}
    with ThreadPoolExecutor(3) as threads:
        done = list(threads.map(lambda argv: run_cli(*argv, dsn=dsn, env=env), BROKEN.values()))
    for name, result in zip(BROKEN, done, strict=True):
        assert_short_error(result, name)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_flag_a_command_does_not_take_is_two_lines_pointing_at_its_help(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser's own errors (the same code in every process; in-process for speed)."""
    with pytest.raises(SystemExit) as exited:
        cli.main([*name.split(" "), "--no-such-flag"])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert exited.value.code == 2 and not out and len(lines) == 2, err
    said = ("unrecognized arguments: --no-such-flag", "the following arguments are required")
    assert any(words in lines[0] for words in said) and "--help" in lines[1], err
    assert not LIBRARY.search(err), err


def test_run_on_a_port_in_use_says_so_before_anything_starts(dsn: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = run_cli("run", "--http-port", str(port), dsn=dsn)
    assert_short_error(done, "run")
    assert f"127.0.0.1:{port}: it is in use" in done.stderr and "--http-port" in done.stderr


@pytest.mark.usefixtures("data")
def test_a_closed_pipe_ends_the_listing_quietly(dsn: str) -> None:
    """`runs list | head -1`: the reader is gone before the listing is written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    env["PROMPTSCHED_DATABASE_URL"] = dsn
    process = subprocess.Popen(
        [sys.executable, "-m", "promptsched", "runs", "list"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # like head -1 having read its line and left
    with process.stderr:
        error = process.stderr.read()
    assert process.wait(timeout=60) == 0 and error == "", error


@pytest.fixture
def api_url(dsn: str, tmp_path: Path) -> Iterator[str]:
    service = Service(dsn, tmp_path / "api.log", env={"PROMPTSCHED_ROLES": "api"})
    try:
        yield f"http://127.0.0.1:{asyncio.run(service.wait_event('api.listening'))['port']}"
    finally:
        service.stop()


@pytest.mark.usefixtures("data")
def test_remote_mode_mistakes_say_what_to_check(dsn: str, api_url: str, tmp_path: Path) -> None:
    token = run_cli("tokens", "create", "--owner", "default", dsn=dsn).stdout.strip()
    base = {"PROMPTSCHED_TOKEN": token, "XDG_CONFIG_HOME": str(tmp_path)}
    with_v1 = run_cli("schedules", "list", env={**base, "PROMPTSCHED_URL": f"{api_url}/v1"})
    assert with_v1.returncode == 0 and "weekly" in with_v1.stdout, with_v1.stderr
    elsewhere = run_cli("schedules", "list", env={**base, "PROMPTSCHED_URL": f"{api_url}/api"})
    assert_short_error(elsewhere, "a URL with a path")
    assert "not a promptsched API route" in elsewhere.stderr and "without /v1" in elsewhere.stderr
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    refused = run_cli("runs", "list", env={**base, "PROMPTSCHED_URL": closed})
    assert_short_error(refused, "unreachable")
    assert "nothing listens there (connection refused)" in refused.stderr
    assert "PROMPTSCHED_URL" in refused.stderr
    wrong = run_cli("schedules", "list", env={**base, "PROMPTSCHED_URL": api_url,
                                              "PROMPTSCHED_TOKEN": "pst_" + "x" * 43})  # fmt: skip
    assert_short_error(wrong, "a wrong token")


@pytest.mark.usefixtures("data")
def test_an_unknown_provider_points_at_the_servers_providers(dsn: str) -> None:
    done = run_cli("schedules", "add", "--name", "n", "--every", "1h", "--prompt", "p",
                   "--provider", "nope", dsn=dsn)  # fmt: skip
    assert_short_error(done, "provider")
    assert "no provider 'nope'" in done.stderr and "PROMPTSCHED_PROVIDERS" in done.stderr
    assert "docs/providers.md" in done.stderr


async def test_notifications_list_and_replay_print_only_their_answer(
    pool: asyncpg.Pool[Any], dsn: str
) -> None:
    helped = run_cli("notifications", "--help", dsn=dsn).stdout
    assert "list" in helped and "dead notifications" in helped
    sid = await factories.schedule(pool, name="mailed")
    run = await factories.pending_run(pool, sid)
    note = await pool.fetchval(
        "INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key, "
        "status, attempts, last_error) VALUES ($1, $2, 'email', '[\"a@example.com\"]', "
        "'succeeded', 'k', 'dead', 5, 'smtp: 550 no such user') RETURNING id",
        run, sid,
    )  # fmt: skip
    listed = run_cli("notifications", "list", dsn=dsn)
    assert listed.returncode == 0 and "smtp: 550 no such user" in listed.stdout
    assert f"#{sid} mailed" in listed.stdout
    assert not listed.stderr
    replayed = run_cli("notifications", "replay", str(note), dsn=dsn)
    assert (replayed.returncode, replayed.stdout, replayed.stderr) == (
        0,
        f"notification {note} is owed again\n",
        "",
    )


def test_doctor_says_an_unreachable_database_in_words(tmp_path: Path) -> None:
    """asyncpg words a refused connection as 'Multiple exceptions: [Errno 111] Connect call
    failed (...)'; doctor's line says what happened and what to check."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"postgresql://nobody@127.0.0.1:{probe.getsockname()[1]}/nope"
    done = run_cli("doctor", "--database-url", closed,
                   env={"PROMPTSCHED_DATA_DIR": str(tmp_path / "none")})  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "database: cannot connect: connection refused" in done.stdout, done.stdout
    assert not LIBRARY.search(done.stdout + done.stderr), done.stdout + done.stderr
