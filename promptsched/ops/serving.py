"""Where this machine's service processes serve their API, as they announce it.

A service writes ``<data dir>/serving/<pid>.json`` once its API listens (the address it really
bound, whatever set the port: ``--http-port``, a config file, ``PROMPTSCHED_HTTP_PORT`` or 0) and
removes it at a clean stop. ``promptsched healthcheck`` (the image's HEALTHCHECK) reads it, so a
container stays healthy whichever way its port was chosen."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

FOLDER = "serving"
# A bind to every address is reached on the loopback one of its family.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


@dataclass(frozen=True, slots=True)
class Serving:
    pid: int
    url: str


def local_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches a server bound to host:port at."""
    host = _LOOPBACK.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def announce(data_dir: Path, host: str, port: int) -> Path | None:
    """Write this process's API address; None (and nothing written) when the directory cannot
    be written: the service serves all the same, and the health check falls back to the port
    its own settings name."""
    folder = data_dir / FOLDER
    path = folder / f"{os.getpid()}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps({"pid": os.getpid(), "url": local_url(host, port)}))
        partial.replace(path)  # a reader never sees half a file
    except OSError:
        return None
    return path


def withdraw(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def announced(data_dir: Path) -> list[Serving]:
    """The live processes' announcements (a killed process's stale file is skipped)."""
    found = []
    for path in sorted((data_dir / FOLDER).glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            serving = Serving(int(entry["pid"]), str(entry["url"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(serving.pid):
            found.append(serving)
    return found
