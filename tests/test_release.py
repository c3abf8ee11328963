"""The release a process reports: ``promptsched --version`` and the commit it was built from
(git at install time, or pip's record of the git URL it installed from, or the build's
``PROMPTSCHED_COMMIT``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import promptsched
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent


def test_version_names_the_release_and_the_commit_of_this_checkout() -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"promptsched {promptsched.__version__} (commit {head})"


def test_a_build_without_git_says_the_commit_it_was_given_or_none() -> None:
    given = run_cli("--version", env={"PROMPTSCHED_COMMIT": "0123456789abcdef"}, cwd=ROOT)
    assert given.stdout.strip() == f"promptsched {promptsched.__version__} (commit 0123456789ab)"
