"""Duration text (``500ms``, ``30s``, ``5m``, ``1h``, ``1d``; a bare number is seconds)."""

from __future__ import annotations

import re
from datetime import timedelta

from promptsched.errors import ValidationError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(text: str, *, field: str) -> timedelta:
    """Parse one duration; several may be joined (``1h30m``). Raises naming ``field``."""
    if not text.strip():
        raise ValidationError(field, "a duration is required, e.g. 500ms, 30s, 5m, 1h, 1d")
    total = 0.0
    parts = re.findall(r"\d+(?:\.\d+)?\s*(?:ms|s|m|h|d|w)?", text.strip())
    if not parts or "".join(parts).replace(" ", "") != text.strip().replace(" ", ""):
        raise ValidationError(field, f"not a duration: {text!r} (use e.g. 500ms, 30s, 5m, 1h, 1d)")
    for part in parts:
        match = _PATTERN.match(part)
        if match is None:
            raise ValidationError(field, f"not a duration: {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if total > 10 * 365 * 86400:
        raise ValidationError(field, f"duration too long: {text!r}")
    return timedelta(seconds=total)


def format_duration(value: timedelta) -> str:
    """The shortest exact text for a duration, as ``parse_duration`` reads it."""
    ms = round(value.total_seconds() * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0 and ms:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
