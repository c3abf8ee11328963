"""Runs schedule math (parsing, previews, explanations, planning) in a worker thread with a
deadline, so the one event loop that serves every role never waits on it.

The math itself is bounded (``schedule.limits``): each search for a fire time has a step
budget and nothing is searched past 2200, so a thread finishes even when its caller stopped
waiting. One runs at a time per event loop (others wait their turn without holding anything):
a CPU-bound thread competes with the loop for the GIL, which the loop then gets back within
a switch interval (5 ms); with two such threads the loop's worst /healthz in a burst of
hostile requests was three times longer (150 ms against 45 ms, tests/test_hostile_schedules.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from promptsched.errors import ValidationError

DEADLINE = 10.0  # seconds, waiting for a thread included
THREADS = 1
T = TypeVar("T")
_SLOTS: RunVar[anyio.CapacityLimiter] = RunVar("promptsched_schedule_math")


def _limiter() -> anyio.CapacityLimiter:
    try:
        return _SLOTS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(THREADS)
        _SLOTS.set(limiter)
        return limiter


async def run(
    fn: Callable[[], T], *, field: str | None = "expression", deadline: float = DEADLINE
) -> T:
    """``fn()`` in a worker thread; after ``deadline`` a ValidationError naming ``field``
    (a TimeoutError when ``field`` is None: the caller's input is not to blame)."""
    try:
        with anyio.fail_after(deadline):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=_limiter())
    except TimeoutError:
        if field is None:
            raise
        raise ValidationError(
            field, f"computing its fire times took longer than {deadline:g} s; try again later"
        ) from None
