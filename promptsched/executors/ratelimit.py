"""A provider's own rate-limit headers read into one pacing hint: when a response says nothing
is left until an instant, how long until then (docs/providers.md, "Header pacing").

Read, per limit (requests, tokens, and Anthropic's input and output tokens): OpenAI-style
``x-ratelimit-remaining-<limit>`` with ``x-ratelimit-reset-<limit>`` (OpenAI, Azure OpenAI,
Groq, and proxies that pass them on), and Anthropic-style
``anthropic-ratelimit-<limit>-remaining`` with ``anthropic-ratelimit-<limit>-reset``. A limit
whose remaining count is 0 paces until its reset; the longest such wait wins. A reset is a
duration as these providers write it (``6m0s``, ``1s``, ``20ms``, ``1h2m3.5s``, or bare
seconds ``2.5``) or an RFC 3339 instant (``2026-03-02T07:00:00Z``), measured against the
response's own ``Date`` header when it has one. Anything else (a header missing, unknown or
malformed, a count that is not a whole number, a reset in the past) changes nothing.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from promptsched.errors import Pace

# The longest wait a header may impose: a reset further away is read as this (a daily limit
# exhausted still lets the fleet look again every hour; Retry-After is not capped).
MAX_PACE = 3600.0
_LIMITS = ("requests", "tokens", "input-tokens", "output-tokens")
_FAMILIES = (
    ("x-ratelimit-remaining-{}", "x-ratelimit-reset-{}"),
    ("anthropic-ratelimit-{}-remaining", "anthropic-ratelimit-{}-reset"),
)
# Every (remaining, reset) header pair, in the order the families and limits are listed.
_NAMES = tuple(
    (remaining.format(limit), reset.format(limit))
    for remaining, reset in _FAMILIES
    for limit in _LIMITS
)
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|us|µs|ns|h|m|s))+")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def parse_reset(value: str, now: datetime) -> float | None:
    """Seconds until a reset written as a duration (``6m0s``, ``20ms``, ``2.5``) or an RFC 3339
    instant, from ``now`` (aware); None when unreadable or not in the future."""
    text = value.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(text)
    elif _DURATION.fullmatch(text):
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    else:
        try:
            instant = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return None
        if instant.tzinfo is None:
            return None  # RFC 3339 always carries an offset
        seconds = (instant - now).total_seconds()
    return seconds if seconds > 0 else None


def _remaining(value: str | None) -> int | None:
    if value is None or not value.strip().lstrip("-").isdigit():
        return None
    return int(value.strip())


def _now(headers: Mapping[str, str], now: datetime | None) -> datetime:
    date = headers.get("date")
    if date:
        try:
            parsed = email.utils.parsedate_to_datetime(date)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        except (TypeError, ValueError, IndexError):
            pass
    return now if now is not None else datetime.now(UTC)


def pace_of(headers: Mapping[str, str], now: datetime | None = None) -> Pace | None:
    """The pacing the headers ask for: the longest wait of a limit with nothing remaining,
    capped at MAX_PACE; None when no limit is exhausted or nothing is readable. Every answer
    passes here: the ``Date`` header is read only when a limit is exhausted."""
    lowered = {key.lower(): value for key, value in headers.items()}
    reference: datetime | None = None
    best: Pace | None = None
    for remaining_name, reset_name in _NAMES:
        remaining = _remaining(lowered.get(remaining_name))
        reset = lowered.get(reset_name)
        if remaining is None or remaining > 0 or reset is None:
            continue
        if reference is None:
            reference = _now(lowered, now)
        seconds = parse_reset(reset, reference)
        if seconds is not None and (best is None or seconds > best.seconds):
            best = Pace(min(seconds, MAX_PACE), reset_name)
    return best
