"""Values as people read them: words instead of booleans and program syntax, and text cut to
a width with an ellipsis that says it was cut."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ELLIPSIS = "…"


def clip(text: str, width: int, *, one_line: bool = True) -> str:
    """``text`` in at most ``width`` characters; when cut, its last one is an ellipsis."""
    if one_line:
        text = " ".join(text.split())
    if width <= 0 or len(text) <= width:
        return text
    return text[: width - 1].rstrip() + ELLIPSIS


def yes_no(value: object) -> str:
    return "yes" if value else "no"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 check``, ``3 checks``."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def number(value: float | int) -> str:
    """A number without program noise: ``4`` for 4.0, ``0.25``, ``1200``."""
    if isinstance(value, bool):
        return yes_no(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def words(value: Any) -> str:
    """Any JSON value in words: "-" for nothing, yes/no, ``k=v, k=v``, never a Python repr."""
    if value is None or value == "" or value == [] or value == {}:
        return "-"
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, int | float):
        return number(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={words(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(words(v) for v in value)
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)
