"""A real PgBouncer in front of the test session's embedded Postgres (tests/test_pgbouncer.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from promptsched.store.embedded import EmbeddedPostgres
from tests.helpers import free_port

PGBOUNCER = os.environ.get("PROMPTSCHED_PGBOUNCER", "/usr/sbin/pgbouncer")
HOW_TO_INSTALL = (
    "install PgBouncer (`make pgbouncer-deps`, or apt-get install pgbouncer) or point "
    "PROMPTSCHED_PGBOUNCER at its binary"
)


class PgBouncer:
    """One ``pgbouncer`` process in ``pool_mode`` listening on a free loopback port, reaching
    every database of ``server`` (a wildcard entry) over its unix socket."""

    def __init__(
        self, server: EmbeddedPostgres, *, pool_mode: str = "transaction", pool_size: int = 20
    ) -> None:
        if not os.access(PGBOUNCER, os.X_OK):
            pytest.fail(f"missing {PGBOUNCER}: {HOW_TO_INSTALL}", pytrace=False)
        self.port = free_port()
        # Readable by the unprivileged user PgBouncer runs as when the tests run as root.
        self.dir = Path(tempfile.mkdtemp(prefix="pgb-", dir="/tmp"))
        self.dir.chmod(0o755)
        userlist = self.dir / "userlist.txt"
        userlist.write_text('"postgres" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={server.socket_dir} port=5432\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {userlist}\n"
            f"pool_mode = {pool_mode}\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
        )
        for path in (userlist, ini):
            path.chmod(0o644)
        self.log_path = self.dir / "pgbouncer.log"
        user = ["-u", "pgserver"] if os.geteuid() == 0 else []  # it refuses to run as root
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [PGBOUNCER, *user, str(ini)], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_listening()

    def _wait_listening(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer is not listening:\n{self.log()}") from None
                time.sleep(0.05)

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def version() -> str:
    out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else "unknown"
