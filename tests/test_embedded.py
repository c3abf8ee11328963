"""The embedded Postgres: private to its user, and stopped by its last user, also after the
service that started it was SIGKILLed (real processes, real signals)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from promptsched.errors import PromptschedError
from promptsched.store import embedded
from promptsched.store.embedded import EmbeddedPostgres
from tests.helpers import Service, wait_until

CLI = Path(sys.executable).parent / "promptsched"


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # A short path, so the socket lives in the data directory itself.
    path = Path(tempfile.mkdtemp(prefix="pse-", dir="/tmp"))
    yield path
    server = EmbeddedPostgres(path)
    if server.is_running():  # a failed test may have left it running
        server.stop("immediate")
    shutil.rmtree(path, ignore_errors=True)


def postmasters(pgdata: Path) -> list[int]:
    """Pids of every Postgres postmaster serving ``pgdata`` (from /proc, not from the data
    directory: an orphan is found whoever started it)."""
    found: dict[int, int] = {}  # pid: parent pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            # The parent is the field after the command's closing parenthesis.
            parent = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if argv[0].endswith(b"/postgres") and b"-D" in argv:
            if argv[argv.index(b"-D") + 1] == str(pgdata).encode():
                found[int(entry.name)] = parent
    # A backend the postmaster has just forked carries its argv until it sets its title.
    return sorted(pid for pid, parent in found.items() if parent not in found)


def _env(data_dir: Path) -> dict[str, str]:
    return {"PROMPTSCHED_DATA_DIR": str(data_dir)}


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")}
    return subprocess.run(
        [str(CLI), *args], env={**full, **env}, cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_service_after_a_sigkill_adopts_the_orphaned_server_and_stops_it(
    data_dir: Path, tmp_path: Path
) -> None:
    pgdata = data_dir / "pgdata"  # mkdtemp gives an absolute, resolved path
    first = Service(None, tmp_path / "first.log", env=_env(data_dir), cwd=tmp_path)
    try:
        await first.ready(timeout=60)
        (orphan,) = postmasters(pgdata)
    finally:
        first.signal(signal.SIGKILL)
        first.stop()
    assert postmasters(pgdata) == [orphan], "the SIGKILLed service's server should outlive it"

    second = Service(None, tmp_path / "second.log", env=_env(data_dir), cwd=tmp_path)
    try:
        await second.ready(timeout=60)
        assert postmasters(pgdata) == [orphan]  # adopted, not a second server
        assert "adopted" in second.log_path.read_text()
        # A CLI command that merely uses the server leaves it to the service.
        listed = _cli("schedules", "list", env=_env(data_dir), cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert postmasters(pgdata) == [orphan]
        assert second.process.poll() is None
    finally:
        assert second.stop() == 0

    async def gone() -> bool:
        return not postmasters(pgdata)

    await wait_until(gone, timeout=30, what="the adopted postmaster to stop")

    # With no service, a command starts the existing database, and stops it again on exit.
    listed = _cli("runs", "list", env=_env(data_dir), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert postmasters(pgdata) == []


def test_the_last_user_stops_the_server_and_earlier_ones_do_not(data_dir: Path) -> None:
    server = EmbeddedPostgres(data_dir, fast_unsafe=True)
    with server.attached(create=True) as first:
        with EmbeddedPostgres(data_dir).attached(create=False) as second:
            assert (first, second) == ("started", "joined")
        assert server.is_running(), "a user left while another still uses the server"
    assert not server.is_running()


def test_the_socket_and_data_directories_are_private(data_dir: Path) -> None:
    server = EmbeddedPostgres(data_dir, fast_unsafe=True)
    with server.attached(create=True):
        for path in (server.data_dir, server.socket_dir, server.pgdata):
            assert path.stat().st_mode & 0o777 == 0o700, path
        if os.geteuid() != 0:
            return
        # As root, try the door itself: another local user cannot connect; the server's own
        # user (the control) can.
        psql = embedded._bin("psql")
        query = [psql, "-h", str(server.socket_dir), "-U", "postgres", "-c", "SELECT 1"]
        owner = pwd.getpwuid(server.socket_dir.stat().st_uid).pw_name
        allowed = subprocess.run(query, user=owner, capture_output=True, text=True, check=False)
        assert allowed.returncode == 0, allowed.stderr
        refused = subprocess.run(query, user="nobody", capture_output=True, text=True, check=False)
        assert refused.returncode != 0
        assert "Permission denied" in refused.stderr, refused.stderr


def test_a_shared_tmp_socket_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)  # too long for a socket path: the socket goes to /tmp
    server = EmbeddedPostgres(deep)
    assert server.socket_dir.parent == Path("/tmp")
    server.socket_dir.mkdir(mode=0o777)
    try:
        server.socket_dir.chmod(0o777)
        if os.geteuid() == 0:
            os.chown(server.socket_dir, pwd.getpwnam("nobody").pw_uid, -1)
            with pytest.raises(PromptschedError, match="not a directory owned by"):
                server._secure_socket_dir()
            os.chown(server.socket_dir, 0, -1)
        server._secure_socket_dir()  # ours: tightened to 0700
        assert server.socket_dir.stat().st_mode & 0o777 == 0o700
    finally:
        server.socket_dir.rmdir()


def test_a_read_finds_no_database_and_creates_nothing(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "nothing")
    with pytest.raises(embedded.NoDatabase, match=str(tmp_path / "nothing")):
        with server.attached(create=False):
            pass
    assert not (tmp_path / "nothing").exists()
