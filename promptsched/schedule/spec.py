"""Schedule specs: validating and canonicalising the five kinds of schedule expression."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import cast, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from promptsched.domain import DstFold as DstFold  # re-exported: the spec's own words
from promptsched.domain import DstGap as DstGap
from promptsched.domain import Kind as Kind
from promptsched.durations import format_duration, parse_duration
from promptsched.errors import ValidationError
from promptsched.schedule import cron, rrule, zone

KINDS: tuple[str, ...] = get_args(Kind)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MACRO_ALIASES = {"@annually": "@yearly", "@midnight": "@daily"}


@dataclass(frozen=True, slots=True)
class Spec:
    """A validated schedule; hashable, so callers may use it as an lru_cache key."""

    kind: Kind
    expression: str  # canonical text, as stored in the DB
    timezone: str = "UTC"  # IANA zone
    dst_gap: DstGap = "shift"  # missing local time: fire just after the gap, or skip it
    dst_fold: DstFold = "first"  # repeated local time: fire at its first occurrence, or both


@dataclass(frozen=True, slots=True)
class At:
    """A one-shot schedule: a single instant."""

    instant: datetime  # aware UTC


@dataclass(frozen=True, slots=True)
class Every:
    """A fixed interval of real time: fires at anchor + k * period for every k >= 0."""

    period: timedelta
    anchor: datetime  # aware UTC; EPOCH unless the expression says `from ...`

    def next_after(self, after: datetime) -> datetime:
        if after < self.anchor:
            return self.anchor
        return self.anchor + ((after - self.anchor) // self.period + 1) * self.period

    def count(self, start: datetime, end: datetime) -> int:
        """Fire times in [start, end], in closed form."""
        first = 0 if start <= self.anchor else -((self.anchor - start) // self.period)
        last = (end - self.anchor) // self.period
        return max(0, last - first + 1) if end >= self.anchor else 0


def parse(
    kind: str,
    expression: str,
    timezone: str = "UTC",
    *,
    dst_gap: str = "shift",
    dst_fold: str = "first",
) -> Spec:
    """Validate a schedule and return its canonical Spec; ValidationError names the field."""
    if kind not in KINDS:
        raise ValidationError("kind", f"unknown schedule kind {kind!r}; use one of {KINDS}")
    if dst_gap not in get_args(DstGap):
        raise ValidationError("dst_gap", f"must be 'shift' or 'skip', not {dst_gap!r}")
    if dst_fold not in get_args(DstFold):
        raise ValidationError("dst_fold", f"must be 'first' or 'both', not {dst_fold!r}")
    if not expression.strip():
        raise ValidationError("expression", f"a {kind} expression is required")
    where = load_zone(timezone)
    try:
        text = _CANONICAL[kind](expression.strip(), where)
    except OverflowError:  # e.g. year 9999 in a zone west of UTC
        raise ValidationError("expression", "a date in it is out of range") from None
    return Spec(cast(Kind, kind), text, timezone, cast(DstGap, dst_gap), cast(DstFold, dst_fold))


def parse_line(text: str, timezone: str = "UTC", **kw: str) -> Spec:
    """Parse one line whose kind is detected from its text.

    `every 15m`, `at 2026-12-01T09:00` (or a bare ISO date-time), an RRULE (with or without a
    DTSTART line, or a bare `FREQ=...`), an `@hourly`-style macro, and otherwise cron.
    """
    stripped = text.strip()
    lower = stripped.lower()
    if lower.startswith("every "):
        return parse("every", stripped[6:], timezone, **kw)
    if lower.startswith("at "):
        return parse("at", stripped[3:], timezone, **kw)
    if lower.startswith(("dtstart", "rrule:", "freq=")):
        return parse("rrule", stripped, timezone, **kw)
    if re.match(r"\d{4}-\d{2}-\d{2}", stripped):
        return parse("at", stripped, timezone, **kw)
    return parse("cron", stripped, timezone, **kw)


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; raises ValidationError("timezone", ...) with a suggestion.

    Only names of the IANA database are zones: "" is not UTC, and the files zoneinfo would
    also open ("localtime", the host's own zone; "Factory"; "posixrules"; the "posix/" and
    "right/" copies) are not zones a schedule can name."""
    if not name.strip():
        raise ValidationError(
            "timezone", f"unknown time zone {name!r}: it must not be empty (use UTC for UTC)"
        )
    try:
        if name not in _zone_names_set():
            raise ValueError(name)
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        close = difflib.get_close_matches(name, _zone_names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else " (use an IANA name like Europe/Paris)"
        raise ValidationError(
            "timezone", f"unknown time zone {name[:100]!r}: not an IANA zone name{hint}"
        ) from None


@lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


_NOT_ZONES = frozenset({"Factory", "localtime", "posixrules"})


@lru_cache(maxsize=1)
def _zone_names_set() -> frozenset[str]:
    return frozenset(
        n
        for n in available_timezones()
        if n not in _NOT_ZONES and not n.startswith(("posix/", "right/"))
    )


@lru_cache(maxsize=1)
def _zone_names() -> list[str]:
    return sorted(_zone_names_set())


def compile_at(expression: str, where: tzinfo) -> At:
    return At(_instant(expression, where, "at"))


def compile_every(expression: str, where: tzinfo) -> Every:
    text = expression.strip()
    if text.lower().startswith("every "):
        text = text[6:]
    period_text, sep, anchor_text = text.partition(" from ")
    period = parse_duration(period_text, field="expression")
    if period < timedelta(seconds=1) or period % timedelta(seconds=1):
        raise ValidationError(
            "expression",
            f"an interval must be a whole number of seconds >= 1s, not {period_text!r}",
        )
    anchor = _instant(anchor_text, where, "every ... from") if sep else EPOCH
    return Every(period, anchor)


def _instant(text: str, where: tzinfo, what: str) -> datetime:
    """An ISO date-time; a local one must exist exactly once in the zone."""
    try:
        value = datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        raise ValidationError(
            "expression", f"{what}: {text!r} is not an ISO date-time like 2026-12-01T09:00"
        ) from None
    value = value.replace(microsecond=0)
    if value.tzinfo is not None:
        return value.astimezone(UTC)
    found = zone.locate(where, value)
    name = getattr(where, "key", str(where))
    if found.kind == zone.GAP:
        raise ValidationError(
            "expression",
            f"{what}: {value.isoformat()} does not exist in {name} (the clocks skip it for "
            "daylight saving); write it with a UTC offset to pick an instant",
        )
    if found.kind == zone.FOLD:
        raise ValidationError(
            "expression",
            f"{what}: {value.isoformat()} happens twice in {name} (the clocks go back); "
            "write it with a UTC offset to say which one",
        )
    return found.first


def _canonical_cron(expression: str, where: tzinfo) -> str:
    cron.compile_cron(expression)
    cron.check_steps(expression)
    text = " ".join(expression.split())
    return _MACRO_ALIASES.get(text.lower(), text.lower()) if text.startswith("@") else text


def _canonical_at(expression: str, where: tzinfo) -> str:
    compile_at(expression, where)
    value = datetime.fromisoformat(expression.replace(" ", "T", 1)).replace(microsecond=0)
    return value.isoformat().replace("+00:00", "Z")


def _canonical_every(expression: str, where: tzinfo) -> str:
    every = compile_every(expression, where)
    text = format_duration(every.period)
    if every.anchor != EPOCH:
        text += " from " + every.anchor.isoformat().replace("+00:00", "Z")
    return text


def _canonical_rrule(expression: str, where: tzinfo) -> str:
    return rrule.canonical(expression, where)


_CANONICAL = {
    "cron": _canonical_cron,
    "rrule": _canonical_rrule,
    "at": _canonical_at,
    "every": _canonical_every,
}
