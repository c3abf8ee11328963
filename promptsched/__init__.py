"""promptsched: a durable scheduler for LLM prompts, coordinated through Postgres."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

__version__ = "0.2.0"


@functools.cache
def commit() -> str:
    """The git commit this code was built from, short: ``PROMPTSCHED_COMMIT`` when the build
    sets it (an image built without its .git); else the commit pip recorded when it installed
    from a git URL (PEP 610, ``direct_url.json``); else that of the checkout the code runs
    from (``make install``, an editable install); else ``unknown``."""
    given = os.environ.get("PROMPTSCHED_COMMIT", "").strip()
    if given:
        return given[:12]
    try:
        recorded = metadata.distribution("promptsched").read_text("direct_url.json")
        vcs = json.loads(recorded or "{}").get("vcs_info") or {}
        if vcs.get("commit_id"):
            return str(vcs["commit_id"])[:12]
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        pass
    here = Path(__file__).resolve().parent.parent
    if (here / ".git").exists():
        try:
            done = subprocess.run(
                ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
                capture_output=True, text=True, timeout=5, check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return "unknown"


def release() -> str:
    """``0.2.0 (commit 1234abcd5678)``: the version and, when known, the commit."""
    built = commit()
    return __version__ if built == "unknown" else f"{__version__} (commit {built})"
