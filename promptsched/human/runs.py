"""A run's standing in words, the same in the CLI and the console: why a slot was skipped,
and what of its text could not be stored as sent."""

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


def overlap_words(run_id: int, *, restarted: bool) -> str:
    """An overlap skip with the run it waited for: right after a restart that run was still
    finishing (its attempt lost with the old process, then run again), not hung."""
    if restarted:
        return f"skipped while run {run_id}, started before the restart, finished"
    return f"skipped while run {run_id} was still unfinished (overlap policy)"


def skip_words(reason: str, missed: int = 0) -> str:
    """``skipped: inside a pause``; with ``missed``, how many more slots the row stands for."""
    words = SKIPS.get(reason, f"skipped: {reason}")
    return words + (f"; it stands for {missed} more missed slots" if missed else "")


def cleaned_words(count: int) -> str:
    """A run's ``cleaned_chars`` in words (promptsched/storable.py)."""
    chars = "1 character" if count == 1 else f"{count} characters"
    return (
        f"{chars} could not be stored as sent (a NUL, a lone surrogate or invalid UTF-8) "
        "and became U+FFFD"
    )
