"""Times as the console shows them: in the schedule's zone, UTC on hover, and relative to the
database's now ("in 3 h") where that helps. The script keeps relative times current."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from promptsched.console.html import Markup, Template
from promptsched.errors import ValidationError
from promptsched.human import times
from promptsched.schedule import spec

_STAMP = Template('<time datetime="$iso" title="$utc">$local</time>')
_RELATIVE = Template(' <span class="rel" data-rel="$iso">$relative</span>')


def zone(name: str | None) -> ZoneInfo:
    """The zone to show times in; UTC for a name this version does not know."""
    try:
        return spec.load_zone(name or "UTC")
    except ValidationError:
        return spec.load_zone("UTC")


def local_text(value: datetime, where: ZoneInfo, *, seconds: bool | None = None) -> str:
    """Like "Mon 02 Mar 2026 09:00 CET"; seconds shown when not zero (or as ``seconds`` says,
    so a list of times reads alike)."""
    return times.local(value, where, seconds=seconds, weekday=True)


def any_seconds(values: Iterable[datetime]) -> bool:
    """Whether a list of times needs seconds to tell them apart."""
    return times.any_seconds(values)


def utc_text(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(value: datetime, now: datetime) -> str:
    """Like "in 3 h", "5 min ago" or "just now": the largest unit, rounded down (as the
    script words it when it keeps them current)."""
    return times.relative(value, now, units=1, now_word="just now")


def stamp(
    value: datetime | None,
    where: ZoneInfo,
    now: datetime | None = None,
    *,
    seconds: bool | None = None,
) -> Markup:
    """``<time>`` in the zone with the UTC instant as its title; with ``now``, the relative
    time after it. An em dash for no time."""
    if value is None:
        return Markup("—")
    iso = value.astimezone(UTC).isoformat()
    text = _STAMP(iso=iso, utc=utc_text(value), local=local_text(value, where, seconds=seconds))
    if now is None:
        return text
    return Markup(text + _RELATIVE(iso=iso, relative=relative(value, now)))


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "—"
    seconds = (end - start).total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"
