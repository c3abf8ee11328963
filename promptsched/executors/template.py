"""Prompt templates: a tiny ``{{ variable }}`` syntax over a fixed set of run-context variables.

No attribute access, filters or code: a tag holds one known variable name. Text outside tags,
including single braces (JSON examples), passes through untouched. Substituted values are
never re-scanned, so a previous output containing ``{{ x }}`` stays literal.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterator, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo

from promptsched.errors import ValidationError

VARIABLES: Mapping[str, str] = {
    "schedule_name": "the schedule's name",
    "schedule_id": "the schedule's id",
    "run_id": "this run's id",
    "slot": "the slot time in the schedule's zone, ISO 8601 with offset",
    "slot_utc": "the slot time in UTC, ISO 8601",
    "timezone": "the schedule's IANA zone, e.g. Europe/Paris",
    "date": "the slot's local date, YYYY-MM-DD",
    "previous_run_at": "time of the previous successful run, in the schedule's zone ('' if none)",
    "previous_slot": "slot of the previous successful run, in the schedule's zone ('' if none)",
    "previous_output": "output of the previous successful run ('' if none), its first "
    "20,000 characters and a note of how many more were cut",
}

# A previous output longer than this is cut to it, with a marker saying how much was cut, so a
# long answer cannot swell every next prompt (docs/monitors.md).
PREVIOUS_OUTPUT_CHARS = 20_000


def cut_marker(more: int) -> str:
    """What follows a cut previous output: ``[... 1,234 more characters cut]``."""
    return f"\n[... {more:,} more characters cut]"


_OPEN, _CLOSE = "{{", "}}"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _fail(field: str, message: str) -> ValidationError:
    return ValidationError(field, message)


def _check_name(inner: str, position: int, field: str, extra: frozenset[str]) -> str:
    name = inner.strip()
    if not name:
        raise _fail(field, f"empty tag {{{{ }}}} at position {position}")
    if _NAME.fullmatch(name) is None:
        raise _fail(
            field,
            f"invalid tag {{{{ {name} }}}} at position {position}: a tag holds one variable "
            "name (no attribute access, filters or expressions)",
        )
    if name not in VARIABLES and name not in extra:
        close = difflib.get_close_matches(name, [*VARIABLES, *extra], n=1)
        hint = f" (did you mean {{{{ {close[0]} }}}}?)" if close else ""
        known = ", ".join([*VARIABLES, *sorted(extra)])
        raise _fail(field, f"unknown variable {{{{ {name} }}}}{hint}; known variables: {known}")
    return name


def _parts(
    template: str, field: str, extra: frozenset[str] = frozenset()
) -> Iterator[tuple[bool, str]]:
    """Yield (is_variable, text) pieces in order, raising on the first bad tag."""
    position = 0
    while True:
        start = template.find(_OPEN, position)
        if start < 0:
            yield False, template[position:]
            return
        end = template.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            raise _fail(field, f"unclosed tag: '{{{{' at position {start} has no '}}}}'")
        yield False, template[position:start]
        yield True, _check_name(template[start + len(_OPEN) : end], start, field, extra)
        position = end + len(_CLOSE)


def validate(template: str, *, field: str = "prompt", extra: frozenset[str] = frozenset()) -> None:
    """Raise ``ValidationError(field, ...)`` if the template has a bad or unknown tag;
    ``extra`` names variables beyond the built-in ones (a follow-up's ``vars``)."""
    if not isinstance(template, str):
        raise _fail(field, "must be a string")
    for _ in _parts(template, field, extra):
        pass


@lru_cache(maxsize=4096)
def _pieces(
    template: str, field: str, extra: frozenset[str] = frozenset()
) -> tuple[tuple[bool, str], ...]:
    # Cached: every run of a schedule renders the same template.
    return tuple(_parts(template, field, extra))


def variables_used(
    template: str, *, field: str = "prompt", extra: frozenset[str] = frozenset()
) -> frozenset[str]:
    """The variable names a (valid) template refers to."""
    return _variables(template, field, extra)


@lru_cache(maxsize=4096)
def _variables(template: str, field: str, extra: frozenset[str]) -> frozenset[str]:
    return frozenset(text for is_variable, text in _pieces(template, field, extra) if is_variable)


def render(
    template: str,
    context: Mapping[str, str],
    *,
    field: str = "prompt",
    extra: frozenset[str] = frozenset(),
) -> str:
    """Substitute each tag with ``context[name]`` ('' when the context lacks it).

    Raises ``ValidationError`` like ``validate`` for a bad template; the worker treats that as
    a permanent failure of the run.
    """
    pieces = [
        str(context.get(text, "")) if is_variable else text
        for is_variable, text in _pieces(template, field, extra)
    ]
    return "".join(pieces)


def build_context(
    *,
    run_id: int,
    schedule_id: int,
    schedule_name: str,
    slot: datetime,
    timezone: str,
    previous_run_at: datetime | None = None,
    previous_output: str | None = None,
    previous_slot: datetime | None = None,
    previous_output_chars: int | None = None,
    names: Collection[str] | None = None,
) -> dict[str, str]:
    """The template variables for one run; ``slot`` must be timezone-aware. With ``names``,
    only those the prompt uses when none is about time: a prompt that names the run or the
    schedule only (a run id to look up, as thousands of calls in flight may) skips the zone
    and the dates.

    ``previous_output`` may come already cut to ``PREVIOUS_OUTPUT_CHARS`` (the query reads no
    more), with ``previous_output_chars`` its whole length: the marker then says how much is
    missing. A longer text given whole is cut here."""
    if slot.tzinfo is None:
        raise ValueError("slot must be timezone-aware")
    if names is not None and not set(names) - _PLAIN:
        plain = {
            "schedule_name": schedule_name,
            "schedule_id": str(schedule_id),
            "run_id": str(run_id),
            "timezone": timezone,
        }
        return {name: plain[name] for name in names}
    zone = ZoneInfo(timezone)
    local = slot.astimezone(zone)
    return {
        "schedule_name": schedule_name,
        "schedule_id": str(schedule_id),
        "run_id": str(run_id),
        "slot": local.isoformat(),
        "slot_utc": slot.astimezone(UTC).isoformat(),
        "timezone": timezone,
        "date": local.date().isoformat(),
        "previous_run_at": previous_run_at.astimezone(zone).isoformat() if previous_run_at else "",
        "previous_slot": previous_slot.astimezone(zone).isoformat() if previous_slot else "",
        "previous_output": _cut(previous_output or "", previous_output_chars),
    }


# The variables that need neither the zone nor a date.
_PLAIN = frozenset({"schedule_name", "schedule_id", "run_id", "timezone"})


def _cut(text: str, whole: int | None) -> str:
    whole = max(whole or 0, len(text))
    if whole <= PREVIOUS_OUTPUT_CHARS:
        return text
    return text[:PREVIOUS_OUTPUT_CHARS] + cut_marker(whole - PREVIOUS_OUTPUT_CHARS)
