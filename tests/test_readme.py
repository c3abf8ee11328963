"""README.md's steps, as written, on a fresh home directory: the commands are read from the
README itself (so they cannot drift), the service is started as it says (`make run`, reusing
the installed .venv), the second terminal's commands run as one shell script, and what the
README promises of them is checked: a succeeded run within seconds, a console token that opens
the API, a local mail sink that prints the message a trigger sends.

Only the ports change: each run takes free ones, through the `ARGS="--http-port N"` README
documents, so the test never meets another process on 8080 or 8025."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from promptsched.store.embedded import EmbeddedPostgres
from tests.helpers import free_port

CHECKOUT = Path(__file__).resolve().parent.parent
README = CHECKOUT / "README.md"
_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks() -> list[str]:
    """README's shell blocks, in order."""
    return [m.group(1) for m in _BLOCK.finditer(README.read_text())]


def block_with(text: str) -> str:
    """The first shell block of README that holds ``text``."""
    found = [b for b in blocks() if text in b]
    assert found, f"README.md has no ```sh block with {text!r}: this test follows its steps"
    return found[0]


def line_with(block: str, text: str) -> str:
    """The command of ``block`` that holds ``text``, its continuation lines joined, without
    its comment."""
    joined = block.replace("\\\n", " ")
    found = [line for line in joined.splitlines() if text in line]
    assert found, f"no command with {text!r} in README's block:\n{block}"
    return re.sub(r"\s+#.*$", "", found[0]).strip()


def _env(home: Path) -> dict[str, str]:
    """A fresh user's environment: a home of its own and no promptsched settings."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PROMPTSCHED_", "MAKE", "MFLAGS")) and k not in ("XDG_DATA_HOME",)
    }
    return {**kept, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


def _wait(predicate: Callable[[], bool], timeout: float, what: str, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            said = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{said}")
        time.sleep(0.2)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def _terminal(command: str, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A command in a terminal of its own (its own process group); Ctrl-C (SIGINT to the
    group) stops it at the end."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", command], cwd=CHECKOUT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def _shell(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A second terminal: the script as typed, from the checkout, stopping at a failure."""
    return subprocess.run(
        ["bash", "-ec", script], cwd=CHECKOUT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def _cli_json(env: dict[str, str], *args: str) -> object:
    done = subprocess.run(
        [str(CHECKOUT / ".venv/bin/promptsched"), *args, "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "home"
    path.mkdir()
    yield path
    server = EmbeddedPostgres(path / ".local/share/promptsched")
    if server.is_running():  # a failed step may have left it running
        server.stop("immediate")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_readme_steps_work_on_a_fresh_home_as_written(tmp_path: Path, home: Path) -> None:
    env = _env(home)
    port, sink_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    run = line_with(block_with("make run"), "make run")
    assert run == "make run"
    second = block_with("promptsched schedules add --name hello")
    token_line = line_with(block_with("tokens create"), "tokens create")
    sink = line_with(block_with("aiosmtpd"), "-m aiosmtpd")
    install_sink = line_with(block_with("aiosmtpd"), "pip install aiosmtpd")
    mailing_run = line_with(block_with("PROMPTSCHED_SMTP_HOST="), "make run")
    mailed = block_with("schedules trigger mailed")

    def ported(command: str) -> str:
        command = command.replace(":8080", f":{port}").replace("8025", str(sink_port))
        if command.endswith("make run"):
            command += f' ARGS="--http-port {port}"'
        return command

    # Terminal 1: the service, on an embedded Postgres created in the fresh home
    with _terminal(ported(run), env, tmp_path / "service.log"):
        _wait(
            lambda: _answers(f"{base}/healthz"), 120, "make run to serve", tmp_path / "service.log"
        )
        assert (home / ".local/share/promptsched/pgdata/PG_VERSION").exists()

        # Terminal 2: README's commands as one script
        done = _shell(second, env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "hello" in done.stdout and "weekly" in done.stdout, done.stdout
        assert "Traceback" not in done.stderr, done.stderr

        def hello_succeeded() -> bool:
            runs = _cli_json(env, "runs", "list", "--schedule", "hello")
            return any(r["status"] == "succeeded" for r in runs)  # type: ignore[attr-defined]

        _wait(hello_succeeded, 30, "a succeeded run of hello", tmp_path / "service.log")

        # The console's token opens what the CLI added (schedules of the owner `default`)
        token = _shell(f'export PATH="$PWD/.venv/bin:$PATH"\n{token_line}', env)
        assert token.returncode == 0, token.stderr
        bearer = token.stdout.strip().splitlines()[-1]
        request = urllib.request.Request(
            f"{base}/v1/schedules", headers={"Authorization": f"Bearer {bearer}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            names = {s["name"] for s in json.load(response)["items"]}
        assert {"hello", "weekly"} <= names
    assert _shell(install_sink, env).returncode == 0

    # Terminal 3: the mail sink; terminal 1 again, pointed at it
    with _terminal(ported(sink), env, tmp_path / "sink.log"):
        _wait(lambda: "127.0.0.1" in _listening(sink_port), 30, "the sink", tmp_path / "sink.log")
        with _terminal(ported(mailing_run), env, tmp_path / "mailing.log"):
            _wait(
                lambda: _answers(f"{base}/healthz"), 60, "make run again", tmp_path / "mailing.log"
            )
            done = _shell(f'export PATH="$PWD/.venv/bin:$PATH"\n{mailed}', env)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "warning" not in done.stderr, done.stderr  # the service can send mail

            def printed() -> bool:
                return "Hello by mail" in (tmp_path / "sink.log").read_text(errors="replace")

            _wait(printed, 30, "the sink to print the mail", tmp_path / "mailing.log")


def _listening(port: int) -> str:
    """'127.0.0.1' once something accepts connections on the port."""
    with socket.socket() as probe:
        probe.settimeout(1)
        return "127.0.0.1" if probe.connect_ex(("127.0.0.1", port)) == 0 else ""
