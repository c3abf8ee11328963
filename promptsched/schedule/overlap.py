"""Overlap policies: what a new slot does while earlier runs of its schedule are unfinished."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, assert_never

from promptsched.domain import RunStatus
from promptsched.schedule.policies import PlannedRun

Policy = Literal["skip", "allow", "buffer_one", "buffer_all", "cancel_other"]
POLICIES: tuple[Policy, ...] = ("skip", "allow", "buffer_one", "buffer_all", "cancel_other")


@dataclass(frozen=True, slots=True)
class OverlapDecision:
    runs: tuple[PlannedRun, ...]
    cancel_unfinished: bool = False


def _skip(run: PlannedRun) -> PlannedRun:
    return replace(run, status=RunStatus.SKIPPED, skip_reason="overlap")


def _keep(planned: tuple[PlannedRun, ...], room: int) -> tuple[PlannedRun, ...]:
    """Keep the first ``room`` pending rows in slot order; the later ones overlap them."""
    decided = []
    for run in planned:
        if run.status == RunStatus.PENDING:
            decided.append(run if room > 0 else _skip(run))
            room -= 1
        else:
            decided.append(run)
    return tuple(decided)


def apply(
    policy: Policy, *, pending: int, running: int, planned: tuple[PlannedRun, ...]
) -> OverlapDecision:
    """Decide the planned rows (in slot order) given the schedule's unfinished runs.

    Slots planned in one tick (a late wake-up, a ``run_all`` catch-up) overlap each other as
    well as the runs that already existed: with ``skip`` only the first of them runs.
    """
    unfinished = pending + running
    if policy == "allow" or policy == "buffer_all":
        return OverlapDecision(planned)
    if policy == "skip":
        return OverlapDecision(_keep(planned, 0 if unfinished else 1))
    if policy == "buffer_one":
        # At most one run executing and one waiting behind it.
        return OverlapDecision(_keep(planned, max(0, 2 - unfinished)))
    if policy == "cancel_other":
        # The newest slot wins: older unfinished runs are cancelled, older planned ones skipped.
        pending_rows = [i for i, run in enumerate(planned) if run.status == RunStatus.PENDING]
        newest = pending_rows[-1] if pending_rows else -1
        runs = tuple(
            _skip(run) if run.status == RunStatus.PENDING and i != newest else run
            for i, run in enumerate(planned)
        )
        return OverlapDecision(runs, cancel_unfinished=unfinished > 0)
    assert_never(policy)
