"""One data directory: the installed ``promptsched`` script, run from any directory outside the
checkout, reaches the same embedded database as the running service; a read never creates one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from promptsched.store.embedded import EmbeddedPostgres
from tests.helpers import Service, wait_until

CLI = Path(sys.executable).parent / "promptsched"
CHECKOUT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A user's home outside the checkout; the default data directory lives under it."""
    path = tmp_path / "home"
    path.mkdir()
    yield path
    server = EmbeddedPostgres(path / ".local/share/promptsched")
    if server.is_running():  # a failed test may have left it running
        server.stop("immediate")


def _env(home: Path) -> dict[str, str]:
    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PROMPTSCHED_") and k not in ("XDG_DATA_HOME", "HOME")
    }
    return {**kept, "HOME": str(home)}


def _cli(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert CHECKOUT not in cwd.resolve().parents and cwd.resolve() != CHECKOUT
    return subprocess.run(
        [str(CLI), *args], env=_env(home), cwd=cwd, capture_output=True, text=True, timeout=60
    )


def _dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize(
    "command", [("runs", "list"), ("schedules", "list"), ("schedules", "show", "1")]
)
def test_a_read_command_without_a_database_creates_nothing_and_says_how(
    tmp_path: Path, home: Path, command: tuple[str, ...]
) -> None:
    cwd = _dir(tmp_path, "work")
    done = _cli(*command, home=home, cwd=cwd)
    assert done.returncode != 0
    where = home / ".local/share/promptsched"
    assert f"no embedded database in {where}" in done.stderr, done.stderr
    assert "promptsched run" in done.stderr
    assert "Traceback" not in done.stderr
    assert _tree(cwd) == [] and _tree(home) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_the_installed_cli_from_anywhere_reaches_the_running_service(
    tmp_path: Path, home: Path
) -> None:
    service_dir, add_dir, list_dir = (_dir(tmp_path, n) for n in ("svc", "add", "list"))
    env = {**_env(home), "PROMPTSCHED_WORKERS": "1"}
    svc = Service(None, tmp_path / "svc.log", env=env, cwd=service_dir, command=(str(CLI),))
    try:
        await svc.ready(timeout=60)
        added = _cli(
            *("schedules", "add", "--name", "everywhere", "--every", "1s", "--prompt", "hi"),
            "--json",
            home=home,
            cwd=add_dir,
        )
        assert added.returncode == 0, added.stderr
        sid = json.loads(added.stdout)["id"]
        listed = _cli("schedules", "list", "--json", home=home, cwd=list_dir)
        assert listed.returncode == 0, listed.stderr
        assert [s["name"] for s in json.loads(listed.stdout)] == ["everywhere"]

        async def succeeded() -> bool:
            # The service ran it: the CLI and the service share one database.
            runs = _cli("runs", "list", "--schedule", str(sid), "--json", home=home, cwd=list_dir)
            assert runs.returncode == 0, runs.stderr
            return any(r["status"] == "succeeded" for r in json.loads(runs.stdout))

        await wait_until(succeeded, timeout=60, interval=0.5, what="a succeeded run")
    finally:
        assert svc.stop() == 0
    assert (home / ".local/share/promptsched/pgdata/PG_VERSION").exists()
    for cwd in (service_dir, add_dir, list_dir):
        assert _tree(cwd) == [], cwd  # no ./.promptsched anywhere


def test_a_database_in_the_old_place_is_moved_to_the_data_directory_once(
    tmp_path: Path, home: Path
) -> None:
    cwd = _dir(tmp_path, "checkout")
    old = cwd / ".promptsched"
    env = {**_env(home), "PROMPTSCHED_DATA_DIR": str(old)}
    created = subprocess.run(
        [str(CLI), "tokens", "create", "--owner", "legacy"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr

    listed = _cli("tokens", "list", home=home, cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    target = home / ".local/share/promptsched"
    assert f"moved the embedded database from {old} to {target}" in listed.stderr
    assert "legacy" in listed.stdout
    assert not old.exists() and (target / "pgdata/PG_VERSION").exists()
    again = _cli("tokens", "list", home=home, cwd=cwd)
    assert again.returncode == 0 and "moved" not in again.stderr


def test_schedules_add_on_a_fresh_home_creates_the_database_as_readme_says(
    tmp_path: Path, home: Path
) -> None:
    """README: "`schedules add` and `tokens create` create the database there if there is
    none"; the schedule is saved, and the answer says no replica runs it yet."""
    cwd = _dir(tmp_path, "work")
    done = _cli(
        "schedules", "add", "--name", "hello", "--every", "1h", "--prompt", "hi",
        home=home, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no embedded database" not in done.stderr
    assert (home / ".local/share/promptsched/pgdata/PG_VERSION").exists()
    listed = _cli("schedules", "list", "--json", home=home, cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    assert [s["name"] for s in json.loads(listed.stdout)] == ["hello"]
