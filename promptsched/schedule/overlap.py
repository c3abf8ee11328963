"""Overlap policies: what a new slot does while earlier runs of its schedule are unfinished."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, assert_never

from promptsched.schedule.policies import PlannedRun

Policy = Literal["skip", "allow", "buffer_one", "buffer_all", "cancel_other"]
POLICIES: tuple[Policy, ...] = ("skip", "allow", "buffer_one", "buffer_all", "cancel_other")


@dataclass(frozen=True, slots=True)
class OverlapDecision:
    runs: tuple[PlannedRun, ...]
    cancel_unfinished: bool = False


def _skip(run: PlannedRun) -> PlannedRun:
    return replace(run, status="skipped", skip_reason="overlap")


def apply(
    policy: Policy, *, pending: int, running: int, planned: tuple[PlannedRun, ...]
) -> OverlapDecision:
    """Decide the planned rows given the schedule's unfinished runs before this tick.

    Runs planned in one tick (a ``run_all`` catch-up) are enqueued together; the policy
    weighs them against the runs that already existed.
    """
    unfinished = pending + running
    if policy == "allow" or policy == "buffer_all":
        return OverlapDecision(planned)
    if policy == "cancel_other":
        return OverlapDecision(planned, cancel_unfinished=unfinished > 0)
    if policy == "skip":
        if unfinished == 0:
            return OverlapDecision(planned)
        return OverlapDecision(tuple(_skip(r) if r.status == "pending" else r for r in planned))
    if policy == "buffer_one":
        # At most one run executing and one waiting behind it.
        room = max(0, 2 - unfinished)
        decided = []
        for run in planned:
            if run.status == "pending":
                if room > 0:
                    room -= 1
                    decided.append(run)
                else:
                    decided.append(_skip(run))
            else:
                decided.append(run)
        return OverlapDecision(tuple(decided))
    assert_never(policy)
