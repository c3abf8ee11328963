"""Runs schedule math (parsing, previews, explanations, planning) and the rendering of model
output (Markdown to HTML or a chat dialect, sanitizing, comparing two answers) in a worker
thread with a deadline, so the one event loop that serves every role never waits on it.

The math itself is bounded (``schedule.limits``): each search for a fire time has a step
budget and nothing is searched past 2200, so a thread finishes even when its caller stopped
waiting. One runs at a time per lane and event loop (others wait their turn, holding nothing):
a CPU-bound thread competes with the loop for the GIL, which the loop then gets back within
a switch interval (5 ms); with two such threads the loop's worst /healthz in a burst of
hostile requests was three times longer (150 ms against 45 ms, tests/test_hostile_schedules.py).

Rendering is bounded the same way: its callers cut an output to a prefix before it is parsed
and compare two answers in bounded time (``monitor.changes``), so a thread whose caller
stopped waiting still ends within seconds (a 60,000-character hostile Markdown text takes
1.5 s; docs/reliability.md, "One answer never holds the loop").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from promptsched.errors import ValidationError

DEADLINE = 10.0  # seconds, waiting for a thread included
RENDER_DEADLINE = 5.0  # seconds for rendering one output (a message, a run page, a diff)
THREADS = 1
T = TypeVar("T")
# One lane for requests and one for the scheduler, so a burst of hostile previews never
# queues the planning of due schedules behind it; one for rendering output (notifications,
# run pages, diffs), so a large answer never queues either behind it.
_LANES = {
    "requests": RunVar[anyio.CapacityLimiter]("promptsched_math_requests"),
    "scheduler": RunVar[anyio.CapacityLimiter]("promptsched_math_scheduler"),
    "render": RunVar[anyio.CapacityLimiter]("promptsched_render"),
}


def _limiter(lane: str) -> anyio.CapacityLimiter:
    slots = _LANES[lane]
    try:
        return slots.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(THREADS)
        slots.set(limiter)
        return limiter


async def run(
    fn: Callable[[], T],
    *,
    field: str | None = "expression",
    deadline: float = DEADLINE,
    lane: str = "requests",
    what: str = "computing its fire times",
) -> T:
    """``fn()`` in a worker thread of ``lane``; after ``deadline`` a ValidationError naming
    ``field`` and saying ``what`` took too long (a TimeoutError when ``field`` is None: the
    caller's input is not to blame)."""
    limiter = _limiter(lane)
    try:
        with anyio.fail_after(deadline):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=limiter)
    except TimeoutError:
        if field is None:
            raise
        raise ValidationError(
            field, f"{what} took longer than {deadline:g} s; try again later"
        ) from None
