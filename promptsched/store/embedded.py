"""The embedded Postgres: a private server in a local data directory (binaries from pgserver).

``run`` starts it when no ``PROMPTSCHED_DATABASE_URL`` is set and stops it on exit; every other
command attaches to the same server, starting it if needed, so a newcomer's second terminal
reaches the running service.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_SOCKET_NAME = ".s.PGSQL.5432"
_SOCKET_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin


def _bin(name: str) -> str:
    with warnings.catch_warnings():
        # pgserver asks platformdirs for a runtime dir at import time and warns without one.
        warnings.simplefilter("ignore")
        from pgserver import _commands  # imported lazily: only the embedded mode needs it

    return str(_commands.POSTGRES_BIN_PATH / name)


class EmbeddedPostgres:
    """A Postgres server owned by one data directory."""

    def __init__(self, data_dir: Path, *, fast_unsafe: bool = False) -> None:
        self.data_dir = data_dir.resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.log_file = self.data_dir / "postgres.log"
        # fsync off: only for throwaway servers (tests, benchmarks).
        self.fast_unsafe = fast_unsafe
        self._user = "pgserver" if os.geteuid() == 0 else None

    @property
    def socket_dir(self) -> Path:
        local = self.data_dir / "run"
        if len(str(local / _SOCKET_NAME)) <= _SOCKET_MAX:
            return local
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path("/tmp") / f"promptsched-{digest}"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def is_running(self) -> bool:
        if not (self.pgdata / "PG_VERSION").exists():
            return False
        result = subprocess.run(
            [_bin("pg_ctl"), "-D", str(self.pgdata), "status"],
            capture_output=True,
            check=False,
            user=self._user,
        )
        return result.returncode == 0

    def ensure_running(self) -> bool:
        """Start the server unless it runs already; True when this call started it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if self.is_running():
                return False
            self._prepare()
            if not (self.pgdata / "PG_VERSION").exists():
                self._initdb()
            self._start()
            return True

    def stop(self, mode: str = "fast") -> None:
        if self.is_running():
            subprocess.run(
                [_bin("pg_ctl"), "-D", str(self.pgdata), "-m", mode, "-w", "stop"],
                capture_output=True,
                check=True,
                user=self._user,
            )

    def _prepare(self) -> None:
        if self._user is None:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgserver import utils

        # Postgres refuses to run as root: run it as an unprivileged user that can reach
        # the data directory and the binaries.
        utils.ensure_user_exists(self._user)
        utils.ensure_prefix_permissions(self.data_dir)
        binaries = Path(_bin("postgres")).parent
        utils.ensure_prefix_permissions(binaries)
        utils.ensure_folder_permissions(binaries, 0o055)
        utils.ensure_folder_permissions(binaries.parent / "lib", 0o044)
        subprocess.run(["chown", "-R", self._user, str(self.data_dir)], check=True)

    def _initdb(self) -> None:
        self.pgdata.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            subprocess.run(["chown", "-R", self._user, str(self.data_dir)], check=True)
        subprocess.run(
            [
                _bin("initdb"),
                "-D",
                str(self.pgdata),
                "--auth=trust",
                "-U",
                "postgres",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            check=True,
            user=self._user,
        )

    def _start(self) -> None:
        socket_dir = self.socket_dir
        socket_dir.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            subprocess.run(["chown", self._user, str(socket_dir)], check=True)
        options = [f"-k {socket_dir}", "-h ''", "-c max_connections=300"]
        if self.fast_unsafe:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        result = subprocess.run(
            [
                _bin("pg_ctl"),
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                "60",
                "-o",
                " ".join(options),
                "start",
            ],
            capture_output=True,
            check=False,
            user=self._user,
        )
        if result.returncode != 0:
            tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise RuntimeError(f"embedded Postgres did not start: {result.stderr!r}\n{tail}")

    @contextmanager
    def _lock(self) -> Iterator[None]:
        with open(self.data_dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
