"""The layer rule of docs/architecture.md is checked by `make lint` (lint-imports with
.importlinter); these tests prove the check fails on an upward import and on a circle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_copy(tmp_path: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the package with `extra` files (path -> source) added."""
    shutil.copytree(
        ROOT / "promptsched",
        tmp_path / "promptsched",
        ignore=shutil.ignore_patterns("__pycache__", "static", "sql"),
    )
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    for relative, source in extra.items():
        (tmp_path / relative).write_text(source)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint_copy(tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    upward = {"promptsched/schedule/upward.py": "from promptsched.store import queries\n"}
    result = _lint_copy(tmp_path, upward)
    assert result.returncode != 0
    assert "promptsched.schedule.upward -> promptsched.store.queries" in result.stdout


def test_an_import_circle_breaks_the_acyclic_contract(tmp_path: Path) -> None:
    circle = {
        "promptsched/executors/circle_a.py": "from promptsched.executors import circle_b\n",
        "promptsched/executors/circle_b.py": "from promptsched.executors import circle_a\n",
    }
    result = _lint_copy(tmp_path, circle)
    assert result.returncode != 0
    assert "No cycles are allowed in promptsched.executors" in result.stdout


def test_the_interfaces_reach_the_store_only_through_ops(tmp_path: Path) -> None:
    """The API and the console go through the operations layer: a handler or a page that
    imports the store directly breaks a contract (the layers alone would let it through)."""
    direct = {
        "promptsched/api/handlers/direct_read.py": "from promptsched.store import queries\n",
        "promptsched/console/direct_read.py": "from promptsched.store import migrate\n",
    }
    result = _lint_copy(tmp_path, direct)
    assert result.returncode != 0
    assert "reach the store only through the operations layer BROKEN" in result.stdout
    assert "promptsched.api.handlers.direct_read -> promptsched.store.queries" in result.stdout
    assert "promptsched.console.direct_read -> promptsched.store.migrate" in result.stdout
