"""This process's attempts in flight: each attempt's state (``InFlight``: its lease as last
renewed, its single ``StopReason``, its deadline while it runs) and the one registry of them
(``InFlightAttempts``) that the pool, the heartbeat and the drain share."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from uuid import UUID

from promptsched.executors.limiter import Permit


class StopReason(IntEnum):
    """Why an attempt stops before its executor's outcome is written; one per attempt.

    Ordered by precedence: a stronger reason replaces a weaker one, never the reverse. A lease
    that is lost (FENCED) or handed back on drain (RELEASED) means the attempt writes nothing,
    whatever else happened; a cancel asked for by the run's owner (CANCEL_REQUESTED) ends it
    ``cancelled`` only while the lease is still ours. A heartbeat skips FENCED attempts, so
    nothing follows FENCED; RELEASED can still be fenced by a heartbeat racing the release.
    """

    NONE = 0
    CANCEL_REQUESTED = 1
    RELEASED = 2
    FENCED = 3

    @property
    def writes_nothing(self) -> bool:
        return self >= StopReason.RELEASED


@dataclass(eq=False, slots=True)
class InFlight:
    """One attempt running in this process."""

    run_id: int
    attempt_id: UUID
    provider: str
    permit: Permit | None
    schedule_id: int = 0
    worker_id: str = ""
    stop: StopReason = StopReason.NONE
    # Its final write is on the way: that write's own guard decides, so a heartbeat that finds
    # the row moved on (by this very write) must not count it as fenced. A phase, not a stop
    # reason: a finishing attempt can still be fenced (its write rejected) or asked to cancel.
    finishing: bool = False
    # Monotonic time the lease was last known to start (the claim, then each renewal sent):
    # a lease lost longer than a lease after it expired; one lost sooner was taken.
    renewed_at: float = field(default_factory=time.monotonic)
    # Token usage its agent steps reported so far: what a failed or timed-out attempt spent.
    usage: dict[str, int] = field(default_factory=dict)
    # The attempt's deadline while its executor runs (set by the runner): what ``interrupt``
    # expires at once.
    deadline: asyncio.Timeout | None = None

    @property
    def fenced(self) -> bool:
        return self.stop is StopReason.FENCED

    @property
    def stopped(self) -> bool:
        return self.stop is not StopReason.NONE

    def stop_for(self, reason: StopReason) -> bool:
        """Record ``reason`` unless an equal or stronger one is recorded; True when recorded."""
        if reason <= self.stop:
            return False
        self.stop = reason
        return True

    def interrupt(self) -> None:
        """Stop the executor now; its stop reason is recorded first (``stop_for``). An attempt
        whose executor has not started yet sees the reason and never starts it; one whose
        executor returned has nothing left to stop."""
        deadline = self.deadline
        if deadline is not None and not deadline.expired():
            deadline.reschedule(0)  # a moment long past: it expires on the next loop turn


class InFlightAttempts(Mapping[int, InFlight]):
    """The one owner of this process's in-flight attempts, by run id.

    The pool adds an attempt on claim and discards it once it is over for this process; the
    heartbeat renews and fences what is here; drain releases what is here and not finishing.
    Read-only as a mapping; changed only through ``add`` and ``discard``.
    """

    def __init__(self) -> None:
        self._by_run: dict[int, InFlight] = {}
        # Per provider, the attempts whose final write is on its way (by run id): their call
        # is over, and a claim under the provider's fleet-wide limit does not count them.
        self._finishing: dict[str, dict[int, InFlight]] = {}

    def __getitem__(self, run_id: int) -> InFlight:
        return self._by_run[run_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_run)

    def __len__(self) -> int:
        return len(self._by_run)

    def add(self, attempt: InFlight) -> None:
        self._by_run[attempt.run_id] = attempt

    def discard(self, attempt: InFlight) -> None:
        """Forget ``attempt`` if it is still the one in flight for its run. A fenced attempt
        that winds down after this process claimed the same run again must not take the new
        attempt out of the registry (it would stop renewing a lease it holds)."""
        if self._by_run.get(attempt.run_id) is attempt:
            del self._by_run[attempt.run_id]
        finishing = self._finishing.get(attempt.provider)
        if finishing is not None and finishing.get(attempt.run_id) is attempt:
            del finishing[attempt.run_id]

    def finish(self, attempt: InFlight) -> None:
        """``attempt``'s final write is on its way: its call is over."""
        attempt.finishing = True
        if self._by_run.get(attempt.run_id) is attempt:
            self._finishing.setdefault(attempt.provider, {})[attempt.run_id] = attempt

    def finishing(self, provider: str, newest: int) -> list[InFlight]:
        """At most ``newest`` of the provider's attempts whose final write is on its way, the
        latest queued first (the least likely to have committed already)."""
        return list(itertools.islice(reversed(self._finishing.get(provider, {}).values()), newest))

    def current(self, attempt: InFlight) -> bool:
        """Whether ``attempt`` is still the one in flight for its run."""
        return self._by_run.get(attempt.run_id) is attempt

    def renewable(self, renewed_before: float = math.inf) -> list[InFlight]:
        """Attempts with a lease to renew, last renewed before ``renewed_before`` (monotonic
        time): a fenced one has nothing left, it only waits to stop."""
        return [a for a in self._by_run.values() if not a.fenced and a.renewed_at < renewed_before]

    def not_finishing(self) -> list[InFlight]:
        """Attempts whose final write is not queued (that write's own guard decides the rest)."""
        return [a for a in self._by_run.values() if not a.finishing]
