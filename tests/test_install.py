"""Installing: ``make run`` installs only what the service needs (the development tools come
with ``make test``/``make lint``), and the built package carries every data file it reads."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _pip_installs(target: str, venv: Path) -> list[list[str]]:
    """The ``pip install`` commands ``make <target>`` would run on a fresh clone (no venv)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        ["make", "-n", "-B", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    commands = []
    for line in re.sub(r"\\\n", " ", done.stdout).splitlines():
        words = shlex.split(line)
        if len(words) > 1 and words[0].endswith("/pip") and words[1] == "install":
            commands.append(words[2:])
    return commands


def _requirements(args: list[str]) -> list[str]:
    skip_next = {"--config-settings", "--progress-bar", "-r", "-c"}
    found, skipping = [], False
    for word in args:
        if skipping:
            skipping = False
        elif word in skip_next:
            skipping = True
        elif word == "-e" or word.startswith("-"):
            continue
        else:
            found.append(word)
    return found


def test_make_run_installs_the_package_without_the_dev_extras(tmp_path: Path) -> None:
    installs = _pip_installs("run", tmp_path / "venv")
    assert installs, "make run installs nothing?"
    targets = [t for args in installs for t in _requirements(args)]
    assert targets == ["."], targets
    assert not any("dev" in t for args in installs for t in args)


def test_make_test_and_lint_install_the_dev_extras(tmp_path: Path) -> None:
    for target in ("test", "lint"):
        targets = [t for a in _pip_installs(target, tmp_path / "venv") for t in _requirements(a)]
        assert ".[dev]" in targets, (target, targets)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_carries_every_data_file_of_the_package(tmp_path: Path) -> None:
    """What ``pip install .`` (the Dockerfile, a user outside the checkout) gets: every file
    under promptsched/ that is not Python source (SQL, the console's static files, py.typed)."""
    tracked = subprocess.run(
        ["git", "ls-files", "promptsched"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    data = {p for p in tracked.stdout.split() if not p.endswith(".py")}
    assert any(p.endswith(".sql") for p in data) and any("static" in p for p in data)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("promptsched-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert data - names == set()
    assert not any(re.match(r"(tests|bench)/", n) for n in names)
