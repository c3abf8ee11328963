"""The embedded Postgres: a private server in one per-user data directory (binaries from
pgserver), shared by the service and every CLI command, and stopped by its last user.

Privacy: the server listens on a unix socket only (no TCP), in a socket directory of mode
``0700`` owned by the server's user, so only that user (and root) can connect; the data
directory is ``0700`` too. That is what peer authentication would give, without a password
that would have to live in DSNs, process lists and logs.

Ownership: every process that uses the server (``promptsched run`` and each CLI command) holds
a shared ``flock`` on ``data_dir/users.lock`` while it does; the kernel drops it when the
process ends, SIGKILL included. A user leaving takes the lock exclusively without waiting: if
that succeeds nobody else uses the server and it stops it. So a CLI command never stops the
server under a running service, and a service started after a SIGKILL finds the orphaned server
with no users, adopts it, and stops it on exit. Starting and stopping happen under
``data_dir/.lock``, so a newcomer never attaches to a server that is being stopped.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Literal

from promptsched.errors import PromptschedError

_SOCKET_NAME = ".s.PGSQL.5432"
_SOCKET_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin
# Where versions before the per-user data directory kept the database: the working directory.
LEGACY_DIR = Path(".promptsched")

_LEFTOVERS = {".lock", "users.lock", "run", "postgres.log"}

Attached = Literal["started", "adopted", "joined"]


class NoDatabase(PromptschedError):
    """A command that only reads found no embedded database, and must not create one."""


def _bin(name: str) -> str:
    with warnings.catch_warnings():
        # pgserver asks platformdirs for a runtime dir at import time and warns without one.
        warnings.simplefilter("ignore")
        from pgserver import _commands  # imported lazily: only the embedded mode needs it

    return str(_commands.POSTGRES_BIN_PATH / name)


def _quiet(message: str) -> None:
    pass


class EmbeddedPostgres:
    """A Postgres server owned by one data directory."""

    def __init__(self, data_dir: Path, *, fast_unsafe: bool = False) -> None:
        self.data_dir = data_dir.expanduser().resolve()
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

    def exists(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def is_running(self) -> bool:
        if not self.exists():
            return False
        result = subprocess.run(
            [_bin("pg_ctl"), "-D", str(self.pgdata), "status"],
            capture_output=True,
            check=False,
            user=self._user,
        )
        return result.returncode == 0

    def ensure_running(self, say: Callable[[str], None] = _quiet) -> bool:
        """Start the server unless it runs already; True when this call started it.

        Holds no claim on the server: tests and benchmarks stop it themselves.
        """
        self._make_data_dir()
        with self._lock():
            return self._start_unlocked(say)

    @contextmanager
    def attached(self, *, create: bool, say: Callable[[str], None] = _quiet) -> Iterator[Attached]:
        """Use the server for the life of the block, starting it if needed (creating the
        database only when ``create``); the last user to leave stops it."""
        if not create and not self.exists():
            raise NoDatabase(
                f"no embedded database in {self.data_dir}. Start the service with "
                "`promptsched run` (it creates the database there), or point at another one "
                "with PROMPTSCHED_DATA_DIR or PROMPTSCHED_DATABASE_URL"
            )
        self._make_data_dir()
        users = open(self.data_dir / "users.lock", "a")  # held for the whole block
        try:
            with self._lock():
                if self._start_unlocked(say):
                    how: Attached = "started"
                elif _try_exclusive(users):
                    how = "adopted"  # running and unused: left behind by a killed process
                else:
                    how = "joined"
                self._secure_socket_dir()  # also for a server started by an older version
                fcntl.flock(users, fcntl.LOCK_SH)
        except BaseException:
            users.close()
            raise
        try:
            yield how
        finally:
            self._leave(users)

    def stop(self, mode: str = "fast") -> None:
        if self.is_running():
            subprocess.run(
                [_bin("pg_ctl"), "-D", str(self.pgdata), "-m", mode, "-w", "stop"],
                capture_output=True,
                check=True,
                user=self._user,
            )
        if self.socket_dir.parent == Path("/tmp"):  # a shared directory: leave nothing behind
            with suppress(OSError):
                self.socket_dir.rmdir()

    def _leave(self, users: IO[str]) -> None:
        try:
            with self._lock():
                # Failing drops our shared lock too (flock conversion is not atomic), which
                # is fine: we are leaving, and every other user is still holding its own.
                if _try_exclusive(users):
                    self.stop()
        finally:
            users.close()

    def _start_unlocked(self, say: Callable[[str], None]) -> bool:
        if self.is_running():
            return False
        self._prepare()
        if not self.exists():
            say(f"creating a new embedded Postgres database in {self.data_dir} (first run only)")
            self._initdb()
        self._start()
        return True

    def _make_data_dir(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The server's log and the lock files live here, next to pgdata (0700 by initdb).
        self.data_dir.chmod(0o700)

    def _secure_socket_dir(self) -> None:
        """Create the socket directory, or check a /tmp one is ours, and make it 0700."""
        path = self.socket_dir
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            info = path.lstat()
            owners = {os.geteuid(), *self._server_uid()}
            if not stat.S_ISDIR(info.st_mode) or info.st_uid not in owners:
                raise PromptschedError(
                    f"{path} (the embedded Postgres socket directory) is not a directory "
                    "owned by this user; remove it or set PROMPTSCHED_DATA_DIR to a shorter path"
                ) from None
        for uid in self._server_uid():  # the server runs as another user (we are root)
            os.chown(path, uid, -1)
        path.chmod(0o700)

    def _server_uid(self) -> list[int]:
        if self._user is None:
            return []
        import pwd

        try:
            return [pwd.getpwnam(self._user).pw_uid]
        except KeyError:
            return []

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
        self.pgdata.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._user is not None:
            subprocess.run(["chown", "-R", self._user, str(self.data_dir)], check=True)
        subprocess.run(
            [
                _bin("initdb"),
                "-D",
                str(self.pgdata),
                # Trust is safe here only because the socket directory is 0700 (see above).
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
        self._secure_socket_dir()
        options = [
            f"-k {self.socket_dir}",
            "-h ''",  # no TCP: the 0700 socket directory is the only way in
            "-c unix_socket_permissions=0700",
            "-c max_connections=300",
        ]
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


def _try_exclusive(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def move_legacy_dir(cwd: Path, target: EmbeddedPostgres) -> str | None:
    """Move a database from ``cwd/.promptsched`` (where earlier versions kept it) into the
    target data directory when that has none yet; returns what was done, for the user."""
    legacy = EmbeddedPostgres(cwd / LEGACY_DIR)
    if not legacy.exists() or target.exists() or legacy.data_dir == target.data_dir:
        return None
    if legacy.is_running():
        raise PromptschedError(
            f"{legacy.data_dir} holds a database from an earlier version whose server is still "
            f"running; stop the service that uses it, then run this again to move it to "
            f"{target.data_dir} (or keep using it with PROMPTSCHED_DATA_DIR={legacy.data_dir})"
        )
    if target.data_dir.exists():
        # Only what a server that never got a database leaves behind may be replaced.
        if not {p.name for p in target.data_dir.iterdir()} <= _LEFTOVERS:
            return None
        shutil.rmtree(target.data_dir)
    target.data_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(legacy.data_dir), str(target.data_dir))
    return f"moved the embedded database from {legacy.data_dir} to {target.data_dir}"


_HOW = {
    "started": "started",
    "adopted": "adopted the server a stopped process left running; stopped on exit",
    "joined": "already running",
}


@contextmanager
def attach(
    data_dir: Path,
    *,
    create: bool,
    announce: bool,
    move_legacy: bool,
    say: Callable[[str], None],
) -> Iterator[str]:
    """The DSN of the embedded server in ``data_dir``, used for the life of the block: the one
    way every command reaches the embedded database. ``move_legacy`` (for the default data
    directory) first moves a database found in ``./.promptsched`` there."""
    server = EmbeddedPostgres(data_dir)
    if move_legacy:
        moved = move_legacy_dir(Path.cwd(), server)
        if moved:
            say(moved)
    with server.attached(create=create, say=say) as how:
        if announce:
            say(f"embedded Postgres in {server.data_dir} ({_HOW[how]}; {server.dsn()})")
        yield server.dsn()
