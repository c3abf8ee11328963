"""What changed between two answers: the comparison a ``changed`` monitor makes (text after
whitespace normalisation, JSON canonically) as a fingerprint, and the difference as people and
programs read it (a unified diff of text, or the JSON paths with their old and new values)."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A notification shows this much of a difference at most (the run pages show it whole).
MAX_DIFF_LINES = 200
MAX_PATHS = 100
_MISSING = object()


def normalized(text: str) -> str:
    """Text as ``changed`` compares it: runs of whitespace are one space, none at the ends."""
    return " ".join(text.split())


def _plain(value: Any) -> Any:
    """A JSON value with every integral float as an int (1.0 and 1 are one JSON number)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def canonical(value: Any) -> str:
    """A JSON value's canonical text: sorted keys, no spaces, integral floats as ints."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(output: str | None, data: Any = _MISSING) -> str:
    """What the finish compares with the last success's: a hash of the canonical JSON when the
    run has a structured output (``data``), else of the normalised text."""
    if data is not _MISSING:
        body = "json:" + canonical(data)
    else:
        body = "text:" + normalized(output or "")
    return hashlib.sha256(body.encode()).hexdigest()


def pointer_fingerprint(found: bool, value: Any) -> str:
    """The fingerprint of the value at a JSON Pointer (``changed /pointer``); a missing value
    has one of its own."""
    return fingerprint(None, value) if found else hashlib.sha256(b"absent").hexdigest()


def text_diff(old: str, new: str, *, old_name: str, new_name: str) -> list[str]:
    """A unified diff of two texts by line (one line of context), without trailing newlines;
    empty when they are equal after whitespace normalisation."""
    if normalized(old) == normalized(new):
        return []
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=old_name, tofile=new_name, n=1, lineterm=""
    )
    return list(lines)


@dataclass(frozen=True, slots=True)
class Change:
    """One JSON path whose value changed: ``old`` or ``new`` is absent when it was added or
    removed (``added``/``removed`` say which)."""

    path: str
    old: Any = None
    new: Any = None
    added: bool = False
    removed: bool = False

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if not self.added:
            out["old"] = self.old
        if not self.removed:
            out["new"] = self.new
        return out

    def line(self) -> str:
        """``/status: "ok" → "degraded"`` (or ``added``, ``removed``)."""
        return line_of(self.json())


def line_of(change: Mapping[str, Any]) -> str:
    """A change as ``Change.json`` (or the API) gives it, in one line for people."""
    path = change.get("path") or "/"
    if "old" not in change:
        return f"{path}: added {_shown(change.get('new'))}"
    if "new" not in change:
        return f"{path}: removed (was {_shown(change['old'])})"
    return f"{path}: {_shown(change['old'])} → {_shown(change['new'])}"


def _shown(value: Any, limit: int = 120) -> str:
    out = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _token(key: Any) -> str:
    return "/" + str(key).replace("~", "~0").replace("/", "~1")


def json_changes(old: Any, new: Any, path: str = "") -> list[Change]:
    """The paths where two JSON values differ, deepest first found, in document order: objects
    by key, arrays by index."""
    if canonical(old) == canonical(new):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[Change] = []
        for key in [*old, *(k for k in new if k not in old)]:
            here = path + _token(key)
            if key not in new:
                found.append(Change(here, old=old[key], removed=True))
            elif key not in old:
                found.append(Change(here, new=new[key], added=True))
            else:
                found += json_changes(old[key], new[key], here)
        return found
    if isinstance(old, list) and isinstance(new, list):
        found = []
        for index in range(max(len(old), len(new))):
            here = path + _token(index)
            if index >= len(new):
                found.append(Change(here, old=old[index], removed=True))
            elif index >= len(old):
                found.append(Change(here, new=new[index], added=True))
            else:
                found += json_changes(old[index], new[index], here)
        return found
    return [Change(path, old=old, new=new)]


def readable(data: Any, indent: int = 0, *, bold: bool = True) -> list[str]:
    """A JSON value as Markdown lines people read: an object as a list of ``**key**: value``
    (``key: value`` without ``bold``, for plain text), nested values indented, an array of
    scalars on one line."""
    pad = "  " * indent
    mark = "**" if bold else ""
    if isinstance(data, dict):
        if not data:
            return [f"{pad}- (empty)"]
        lines: list[str] = []
        for key, value in data.items():
            if _scalar(value) or (isinstance(value, list) and all(map(_scalar, value))):
                lines.append(f"{pad}- {mark}{key}{mark}: {_inline(value)}")
            else:
                lines.append(f"{pad}- {mark}{key}{mark}:")
                lines += readable(value, indent + 1, bold=bold)
        return lines
    if isinstance(data, list):
        if all(map(_scalar, data)):
            return [f"{pad}- {_inline(data)}"]
        lines = []
        for number, item in enumerate(data, start=1):
            if _scalar(item):
                lines.append(f"{pad}- {_inline(item)}")
            else:
                lines.append(f"{pad}- item {number}:")
                lines += readable(item, indent + 1, bold=bold)
        return lines
    return [f"{pad}- {_inline(data)}"]


def _scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _inline(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_inline(v) for v in value) or "(none)"
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "(none)"}[value]
    return str(value)
