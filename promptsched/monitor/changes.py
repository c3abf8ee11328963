"""What changed between two answers: the comparison a ``changed`` monitor makes (text after
whitespace normalisation, JSON canonically) as a fingerprint, and the difference as people and
programs read it (a unified diff of text, or the JSON paths with their old and new values)."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# A notification shows this much of a difference at most (the run pages show it whole).
MAX_DIFF_LINES = 200
MAX_PATHS = 100
# The lines two texts do not share at their ends are matched line by line only up to this
# many pairs (difflib is quadratic at worst: 2,000 against 2,000 edited lines take 0.6 s).
MAX_DIFF_CELLS = 4_000_000
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
    empty when they are equal after whitespace normalisation.

    Its cost is bounded whatever the texts' size (up to a provider's 10 MB): difflib matches
    lines (quadratic at worst) only where there are at most ``MAX_DIFF_CELLS`` pairs of them.
    Longer texts first have the lines both share at the start and at the end set aside (in
    linear time); the lines between are matched when they are few enough, else shown as
    replaced, in one hunk."""
    if normalized(old) == normalized(new):
        return []
    a, b = old.splitlines(), new.splitlines()
    if len(a) * len(b) <= MAX_DIFF_CELLS:  # small enough for difflib as it is
        return list(
            difflib.unified_diff(a, b, fromfile=old_name, tofile=new_name, n=1, lineterm="")
        )
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    middle_a, middle_b = a[head : len(a) - tail], b[head : len(b) - tail]
    codes: list[tuple[str, int, int, int, int]] = [("equal", 0, head, 0, head)]
    if len(middle_a) * len(middle_b) <= MAX_DIFF_CELLS:
        found = difflib.SequenceMatcher(None, middle_a, middle_b).get_opcodes()
        codes += [(tag, i + head, j + head, k + head, m + head) for tag, i, j, k, m in found]
    else:
        codes.append(("replace", head, len(a) - tail, head, len(b) - tail))
    codes.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
    lines = [f"--- {old_name}", f"+++ {new_name}"]
    for group in _Opcodes(codes).get_grouped_opcodes(1):
        first, last = group[0], group[-1]
        lines.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + line for line in a[i1:i2]]
                continue
            lines += ["-" + line for line in a[i1:i2]]
            lines += ["+" + line for line in b[j1:j2]]
    return lines


class _Opcodes(difflib.SequenceMatcher):  # type: ignore[type-arg]
    """difflib's grouping of opcodes into hunks, over opcodes found as ``text_diff`` finds
    them (with the shared lines at both ends already set aside)."""

    def __init__(self, codes: list[tuple[str, int, int, int, int]]) -> None:
        super().__init__(None, "", "")
        self._codes = [code for code in codes if code[0] != "equal" or code[1] < code[2]]

    def get_opcodes(self) -> list[tuple[str, int, int, int, int]]:  # type: ignore[override]
        return list(self._codes) or [("equal", 0, 0, 0, 0)]


def _range(start: int, stop: int) -> str:
    """A hunk's range as ``unified_diff`` writes it (``3``, ``3,4``, or ``2,0`` when empty)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


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


def json_changes(old: Any, new: Any, path: str = "", *, limit: int | None = None) -> list[Change]:
    """The paths where two JSON values differ, deepest first found, in document order: objects
    by key, arrays by index; at most ``limit`` of them. One walk over both values (values are
    compared as ``canonical`` writes them), so a large answer costs time in proportion to its
    size."""
    found: list[Change] = []
    _walk(old, new, path, found, limit if limit is not None else -1)
    return found


def _walk(old: Any, new: Any, path: str, found: list[Change], limit: int) -> None:
    if len(found) == limit:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            if len(found) == limit:
                return
            here = path + _token(key)
            if key not in new:
                found.append(Change(here, old=old[key], removed=True))
            elif key not in old:
                found.append(Change(here, new=new[key], added=True))
            else:
                _walk(old[key], new[key], here, found, limit)
    elif isinstance(old, list) and isinstance(new, list):
        for index in range(max(len(old), len(new))):
            if len(found) == limit:
                return
            here = path + _token(index)
            if index >= len(new):
                found.append(Change(here, old=old[index], removed=True))
            elif index >= len(old):
                found.append(Change(here, new=new[index], added=True))
            else:
                _walk(old[index], new[index], here, found, limit)
    elif not _same(old, new):
        found.append(Change(path, old=old, new=new))


def _same(old: Any, new: Any) -> bool:
    """Two values of which at least one is not an object or an array, compared as their
    ``canonical`` texts would be (1 and 1.0 are one number; true and 1 are not)."""
    if type(old) is type(new) and not isinstance(old, dict | list) and old == new:
        return True
    if isinstance(old, dict | list) or isinstance(new, dict | list):
        return False
    return canonical(old) == canonical(new)


def readable(data: Any, indent: int = 0, *, bold: bool = True) -> list[str]:
    """A JSON value as Markdown lines people read: an object as a list of ``**key**: value``
    (``key: value`` without ``bold``, for plain text), nested values indented, an array of
    scalars on one line."""
    return list(_readable(data, indent, "**" if bold else ""))


def readable_text(data: Any, *, bold: bool = True, limit: int) -> str:
    """``readable`` joined by line ends, made only as far as ``limit`` characters (a large
    answer is not written out whole to be cut)."""
    lines: list[str] = []
    used = 0
    for line in _readable(data, 0, "**" if bold else ""):
        lines.append(line)
        used += len(line) + 1
        if used > limit:
            break
    return "\n".join(lines)


def _readable(data: Any, indent: int, mark: str) -> Iterator[str]:
    pad = "  " * indent
    if isinstance(data, dict):
        if not data:
            yield f"{pad}- (empty)"
        for key, value in data.items():
            if _scalar(value) or (isinstance(value, list) and all(map(_scalar, value))):
                yield f"{pad}- {mark}{key}{mark}: {_inline(value)}"
            else:
                yield f"{pad}- {mark}{key}{mark}:"
                yield from _readable(value, indent + 1, mark)
    elif isinstance(data, list):
        if all(map(_scalar, data)):
            yield f"{pad}- {_inline(data)}"
            return
        for number, item in enumerate(data, start=1):
            if _scalar(item):
                yield f"{pad}- {_inline(item)}"
            else:
                yield f"{pad}- item {number}:"
                yield from _readable(item, indent + 1, mark)
    else:
        yield f"{pad}- {_inline(data)}"


def _scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _inline(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_inline(v) for v in value) or "(none)"
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "(none)"}[value]
    return str(value)
