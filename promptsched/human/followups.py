"""A follow-up's checks in words, the same in the CLI, the console and every message: what a
check decided ("not resolved, check again in 6 h"), how it ended, and where the chain stands
("check 2 of 5: not resolved, next check at ...")."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, tzinfo
from typing import Any

from promptsched.human import times

STATES = {"active": "active", "done": "done (resolved)", "ended": "ended",
          "cancelled": "cancelled"}  # fmt: skip
# A check's outcome (followup_checks.outcome): "recheck" left it unresolved, "done" resolved
# it, anything else ended the chain.
OUTCOMES = {
    "recheck": "not resolved: checked again",
    "done": "resolved",
    "max_checks": "ended: max checks reached",
    "horizon": "ended: next check beyond the horizon",
    "past": "ended: next check in the past",
    "invalid": "ended: its answer could not be read",
    "failed": "ended: the check's run died",
    "cancelled": "ended: the check's run was cancelled",
    "skipped": "ended: the check's run was skipped",
}


def state_words(state: str, ended_reason: str | None = None) -> str:
    """``active``, ``done (resolved)``, ``ended: max checks reached``, ``cancelled``."""
    if state == "ended" and ended_reason:
        return OUTCOMES.get(ended_reason, f"ended: {ended_reason}")
    return STATES.get(state, state)


def outcome_words(outcome: str | None) -> str:
    return OUTCOMES.get(outcome or "", outcome or "-")


def decision_words(
    decision: Mapping[str, Any] | None, where: str | tzinfo | None = None, *, final: bool = False
) -> str:
    """What a check answered: "check again in 6 h", "check again at 2026-03-04 09:00 UTC",
    "unreadable: ...", or, for one that asked nothing, "resolved (no recheck asked)"."""
    if not decision:
        return "resolved (no recheck asked)" if final else "-"
    if "recheck_in" in decision:
        try:
            return f"check again in {times.span(float(decision['recheck_in']))}"
        except (TypeError, ValueError):
            return f"check again in {decision['recheck_in']}"
    if "recheck_at" in decision:
        at = times.instant(str(decision["recheck_at"]))
        return f"check again at {times.local(at, where) if at else decision['recheck_at']}"
    if "error" in decision:
        return f"unreadable: {decision['error']}"
    return ", ".join(f"{k} {v}" for k, v in decision.items())


def check_headline(
    *,
    number: int,
    max_checks: int,
    outcome: str | None,
    next_at: datetime | str | None = None,
    where: str | tzinfo | None = None,
) -> str:
    """One check, as a notification says it: "check 2 of 5: not resolved, next check at
    2026-03-02 15:00 UTC", "check 4 of 5: resolved", "check 5 of 5: not resolved, max checks
    reached"."""
    head = f"check {number} of {max_checks}"
    when = times.instant(next_at) if isinstance(next_at, str) else next_at
    if outcome == "recheck" and when is not None:
        return f"{head}: not resolved, next check at {times.local(when, where)}"
    if outcome == "done":
        return f"{head}: resolved"
    if outcome in ("max_checks", "horizon", "past"):
        return f"{head}: not resolved, and no further check ({OUTCOMES[outcome][7:]})"
    return f"{head}: {outcome_words(outcome)}"
