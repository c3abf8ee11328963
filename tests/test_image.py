"""``make image`` builds deploy/Dockerfile where a container runtime works and has the base
image; elsewhere (no runtime, no daemon, no registry to pull the base from) this skips."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = re.compile(r"^ARG PYTHON_VERSION=(\S+)", re.M)


def _runtime() -> str:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    match = BASE.search(dockerfile)
    assert match, "deploy/Dockerfile names no PYTHON_VERSION"
    base = f"python:{match.group(1)}-slim"
    for name in ("podman", "docker"):
        if shutil.which(name) is None:
            continue
        if subprocess.run([name, "info"], capture_output=True, check=False).returncode != 0:
            continue
        found = subprocess.run([name, "image", "inspect", base], capture_output=True, check=False)
        if found.returncode == 0:
            return name
    pytest.skip(f"no working container runtime with the base image {base} here")


@pytest.mark.slow
def test_make_image_builds_a_runtime_without_installers() -> None:
    runtime = _runtime()
    tag = "promptsched:test-image"
    built = subprocess.run(
        ["make", "image", f"CONTAINER_RUNTIME={runtime}", f"IMAGE={tag}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]

    def inside(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [runtime, "run", "--rm", "--network", "host", "--entrypoint", command[0], tag,
             *command[1:]],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    assert inside("promptsched", "healthcheck", "--help").returncode == 0
    no_pip = inside("python", "-c", "import pip")
    assert no_pip.returncode != 0 and "No module named 'pip'" in no_pip.stderr, no_pip
    no_setuptools = inside("python", "-c", "import setuptools")
    assert no_setuptools.returncode != 0, no_setuptools
