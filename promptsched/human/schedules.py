"""A schedule's state as people read it: enabled, paused (until when, and why), or done (a
one-shot that fired, or a rule with no more fire times)."""

from __future__ import annotations

from datetime import datetime, tzinfo

from promptsched.human import times


def state_key(enabled: bool, cursor: datetime | None) -> str:
    """``enabled``, ``paused`` or ``done``: an enabled schedule whose cursor is gone never
    fires again."""
    if not enabled:
        return "paused"
    return "enabled" if cursor is not None else "done"


def state_words(
    *,
    enabled: bool,
    cursor: datetime | None,
    kind: str,
    paused_until: datetime | None = None,
    reason: str | None = None,
    zone: str | tzinfo | None = None,
    now: datetime | None = None,
) -> str:
    """``enabled``, ``done (fired once)``, ``paused until 2026-03-02 09:00 CET (in 3 h)
    (holiday)``; the distance only when ``now`` is given."""
    key = state_key(enabled, cursor)
    if key == "done":
        return "done (fired once)" if kind == "at" else "done (no more fire times)"
    if key == "enabled":
        return "enabled"
    text = "paused"
    if paused_until is not None:
        until = (
            times.when(paused_until, zone, now) if now is not None
            else times.local(paused_until, zone)
        )  # fmt: skip
        text = f"paused until {until}"
    return f"{text} ({reason})" if reason else text
