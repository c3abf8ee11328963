"""The event-loop probe: it sleeps a fixed interval again and again and records how late each
sleep woke up, so a request or computation that holds the one shared loop shows as lag."""

from __future__ import annotations

import time

import anyio
import structlog
from anyio.abc import TaskStatus

from promptsched.metrics import Metrics

INTERVAL = 0.25  # seconds between probes; the lag itself is measured to the clock's resolution
LOGGED = 1.0  # a lag this long is also logged, so the stall can be matched with other lines

log = structlog.get_logger("loop_probe")


class LoopProbe:
    def __init__(self, metrics: Metrics, *, interval: float = INTERVAL) -> None:
        self.metrics = metrics
        self.interval = interval

    async def run_once(self) -> float:
        """One probe: sleep ``interval``, record and return how much later than that it woke.
        Monotonic time: this is a local duration, never compared with the database's clock."""
        started = time.monotonic()
        await anyio.sleep(self.interval)
        lag = max(0.0, time.monotonic() - started - self.interval)
        self.metrics.event_loop_lag.observe(lag)
        if lag >= LOGGED:
            log.warning("event_loop.lagged", seconds=round(lag, 3))
        return lag

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.run_once()
