"""A run's standing in words, the same in the CLI and the console: why a slot was skipped."""

from __future__ import annotations

# Why a slot did not run (runs.skip_reason); any other reason is shown as it is.
SKIPS = {
    "overlap": "skipped: an earlier run was still unfinished (overlap policy)",
    "misfire": "skipped: found late, dropped by the misfire policy",
    "catchup_window": "skipped: older than the catch-up window",
    "disabled": "skipped: the schedule was paused when its run was due to start",
    "paused": "skipped: inside a pause",
    "budget": "skipped: a budget was reached",
}


def skip_words(reason: str, missed: int = 0) -> str:
    """``skipped: inside a pause``; with ``missed``, how many more slots the row stands for."""
    words = SKIPS.get(reason, f"skipped: {reason}")
    return words + (f"; it stands for {missed} more missed slots" if missed else "")
