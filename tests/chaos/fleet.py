"""The ``promptsched run`` processes of a chaos run: start, kill, freeze and restart them, and
notice any that exit without being told to (a crash is an invariant violation)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from tests.helpers import Service


@dataclass
class Crash:
    member: int
    pid: int
    code: int | None
    tail: str


@dataclass
class Fleet:
    """``size`` identical replicas; member ``i``'s incarnations log to ``p<i>.<n>.log``."""

    dsn: str
    logs: Path
    size: int
    env: Mapping[str, str]
    members: list[Service] = field(default_factory=list)
    incarnations: list[int] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)
    log_paths: list[Path] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)

    def _spawn(self, index: int) -> Service:
        while len(self.incarnations) <= index:
            self.incarnations.append(0)
        self.incarnations[index] += 1
        path = self.logs / f"p{index}.{self.incarnations[index]}.log"
        self.log_paths.append(path)
        return Service(self.dsn, path, env=self.env)

    async def start(self) -> None:
        self.members = [self._spawn(i) for i in range(self.size)]
        for member in self.members:
            await member.ready(timeout=60)

    async def restart(self, index: int) -> Service:
        """A new incarnation of member ``index`` (the old one must have exited)."""
        self.members[index] = self._spawn(index)
        await self.members[index].ready(timeout=60)
        return self.members[index]

    async def kill(self, index: int, signum: int = signal.SIGKILL, timeout: float = 30) -> int:
        """Send ``signum`` and wait for the exit; returns the exit code."""
        member = self.members[index]
        member.signal(signal.SIGCONT)
        member.signal(signum)
        return await _exited(member, timeout)

    def freeze(self, index: int) -> None:
        self.members[index].signal(signal.SIGSTOP)

    def thaw(self, index: int) -> None:
        self.members[index].signal(signal.SIGCONT)

    def pid_of(self, index: int) -> int:
        return self.members[index].pid

    def index_of_worker(self, worker_id: str) -> int | None:
        for index, member in enumerate(self.members):
            if worker_id.endswith(f":{member.pid}"):
                return index
        return None

    async def revive_crashed(self) -> list[Crash]:
        """Record and restart every member that exited on its own."""
        found = []
        for index, member in enumerate(self.members):
            code = member.process.poll()
            if code is None:
                continue
            tail = member.log_path.read_text(errors="replace")[-3000:]
            member.stop()
            crash = Crash(index, member.pid, code, tail)
            self.crashes.append(crash)
            found.append(crash)
            await self.restart(index)
        return found

    async def stop_all(self) -> list[int]:
        """SIGTERM every member; returns the exit codes (0 is a clean drain)."""
        for member in self.members:
            member.signal(signal.SIGCONT)
            member.signal(signal.SIGTERM)
        codes = [await _exited(member, 30) for member in self.members]
        self.exit_codes = codes
        return codes

    def terminate_all(self) -> None:
        """Last resort on the way out: no process outlives the run."""
        for member in self.members:
            if member.process.poll() is None:
                os.kill(member.pid, signal.SIGKILL)
            member.stop()


async def _exited(member: Service, timeout: float) -> int:
    """Wait for the exit without signalling again (a second SIGTERM would cut the drain);
    SIGKILL only if it hangs past ``timeout``."""
    try:
        code = await anyio.to_thread.run_sync(member.process.wait, timeout)
    except subprocess.TimeoutExpired:
        member.process.kill()
        code = await anyio.to_thread.run_sync(member.process.wait)
    member.stop()  # closes the log
    return code
