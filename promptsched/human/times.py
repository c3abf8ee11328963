"""Instants and durations as people read them: in the schedule's zone with the zone's own
abbreviation, the distance from now ("in 3 min", "5 min ago"), spans in words ("6 h")."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))


def zone(name: str | tzinfo | None) -> tzinfo:
    """The zone to show times in: ``name``'s, UTC for none or one this machine does not know."""
    if isinstance(name, tzinfo):
        return name
    if not name or name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def instant(value: str | datetime | None) -> datetime | None:
    """An instant from the API's ISO text (or already one); None for none or unreadable."""
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def span(value: timedelta | float, *, units: int = 2) -> str:
    """A duration in words, its ``units`` largest units: "6 h", "1 h 30 min", "4 s" (seconds
    only under a minute: "3 min", not "3 min 20 s")."""
    seconds = abs(value.total_seconds() if isinstance(value, timedelta) else float(value))
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds else "0 s"
    left, parts = int(seconds), list[str]()
    for size, unit in _UNITS:
        if size == 1 and parts:
            break
        if left >= size and len(parts) < units:
            parts.append(f"{left // size} {unit}")
            left %= size
        elif parts:
            break  # "1 d 0 h 5 min" says less than "1 d"
    return " ".join(parts)


def relative(value: datetime, now: datetime, *, units: int = 2, now_word: str = "now") -> str:
    """``value`` against ``now`` in words: "in 3 min", "1 h 20 min ago", or ``now_word``."""
    delta = value - now
    if abs(delta) < timedelta(seconds=1):
        return now_word
    words = span(delta, units=units)
    return f"in {words}" if delta > timedelta(0) else f"{words} ago"


def local(value: datetime, where: str | tzinfo | None, *, seconds: bool | None = None,
          weekday: bool = False) -> str:  # fmt: skip
    """``2026-03-02 09:00 CET`` (``Mon 02 Mar 2026 09:00 CET`` with ``weekday``); seconds
    when not zero, or as ``seconds`` says (so a column of times reads alike)."""
    shown = value.astimezone(zone(where))
    if seconds is None:
        seconds = bool(shown.second or shown.microsecond)
    clock = "%H:%M:%S" if seconds else "%H:%M"
    day = "%a %d %b %Y" if weekday else "%Y-%m-%d"
    return shown.strftime(f"{day} {clock} %Z")


def when(value: str | datetime | None, where: str | tzinfo | None, now: datetime,
         *, none: str = "-", seconds: bool | None = None) -> str:  # fmt: skip
    """An instant in ``where`` with its distance from ``now``: ``2026-03-02 09:00 CET (in 3
    min)``; ``none`` for no instant."""
    found = instant(value)
    if found is None:
        return none
    return f"{local(found, where, seconds=seconds)} ({relative(found, now)})"


def any_seconds(values: Iterable[str | datetime | None]) -> bool:
    """Whether a column of times needs seconds to tell them apart (then all show them)."""
    found = (instant(v) for v in values)
    return any(v is not None and bool(v.second or v.microsecond) for v in found)


def zone_words(name: str | None) -> str:
    """The zone as a line says it after a local time: nothing for UTC (its abbreviation
    already says it), else ``(Europe/Paris)``."""
    return "" if not name or name == "UTC" else f" ({name})"
