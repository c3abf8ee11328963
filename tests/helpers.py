"""Helpers for tests: bounded waits on conditions, real service processes, one-off CLI
processes, and an executor's failure."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio
import asyncpg
import pytest

from promptsched.errors import ExecutorError
from promptsched.executors.base import ExecutionRequest, Executor
from promptsched.store.embedded import EmbeddedPostgres

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process a test starts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def wait_until(
    predicate: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        await anyio.sleep(interval)


async def executor_failure(
    executor: Executor, request: ExecutionRequest, *, secret: str
) -> ExecutorError:
    """The error ``executor`` raises for ``request``, checked to name ``secret`` nowhere in
    its text or its repr."""
    with pytest.raises(ExecutorError) as caught:
        await executor.execute(request)
    assert secret not in str(caught.value) and secret not in repr(caught.value)
    return caught.value


def assert_every_second_once(slots: Sequence[datetime]) -> None:
    """Ordered slots of a per-second schedule: none doubled, and consecutive seconds from the
    first to the last (none lost)."""
    assert len(slots) == len(set(slots)), "a slot produced two runs"
    assert [(s - slots[0]).total_seconds() for s in slots] == list(range(len(slots)))


async def admin_execute(server: EmbeddedPostgres, statement: str) -> None:
    """Run one statement (CREATE or DROP DATABASE) on ``server``'s maintenance database."""
    admin = await asyncpg.connect(server.dsn())
    try:
        await admin.execute(statement)
    finally:
        await admin.close()


def run_cli(
    *args: str,
    dsn: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """One ``promptsched`` command in its own process (in ``cwd``, default this one), with no
    ``PROMPTSCHED_*`` variables of ours but the database (when ``dsn`` is given) and ``env``;
    its output is captured."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    if dsn:
        full_env["PROMPTSCHED_DATABASE_URL"] = dsn
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "promptsched", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


class Service:
    """A real ``promptsched run`` process with its JSON log captured to a file."""

    def __init__(
        self,
        dsn: str | None,
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        args: tuple[str, ...] = (),
        cwd: Path | None = None,
        command: tuple[str, ...] = (sys.executable, "-m", "promptsched"),
    ) -> None:
        """``dsn=None`` leaves the database to the embedded data directory that ``env``
        names (``PROMPTSCHED_DATA_DIR``, or ``XDG_DATA_HOME``/``HOME``)."""
        self.log_path = log_path
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
        full_env.update(
            {
                "PROMPTSCHED_HTTP_PORT": "0",
                "PROMPTSCHED_LOG_FORMAT": "json",
                "PROMPTSCHED_LOG_LEVEL": "info",
                "PROMPTSCHED_LEASE": "2s",
                "PROMPTSCHED_HEARTBEAT": "500ms",
                "PROMPTSCHED_DRAIN_GRACE": "1s",
                "PROMPTSCHED_RETRY_BASE": "100ms",
                "PROMPTSCHED_RETRY_MAX": "500ms",
            }
        )
        if dsn is not None:
            full_env["PROMPTSCHED_DATABASE_URL"] = dsn
        full_env.update(env or {})
        self._log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [*command, "run", *args],
            env=full_env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def has_event(self, name: str, **fields: Any) -> dict[str, Any] | None:
        for event in self.events():
            if event.get("event") == name and all(event.get(k) == v for k, v in fields.items()):
                return event
        return None

    async def wait_event(self, name: str, *, timeout: float = 20, **fields: Any) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            if self.process.poll() is not None and not self.has_event(name, **fields):
                raise AssertionError(
                    f"service exited ({self.process.returncode}) before {name}:\n"
                    + self.log_path.read_text()[-3000:]
                )
            return self.has_event(name, **fields)

        return await wait_until(check, timeout=timeout, what=f"log event {name} {fields}")

    async def ready(self, timeout: float = 30) -> dict[str, Any]:
        return await self.wait_event("supervisor.ready", timeout=timeout)

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM, wait for a clean exit (SIGKILL if it hangs); returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log.close()
        return code
