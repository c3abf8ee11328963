"""A scheduler batch's write, planned group by group: each group of due schedules that plan
alike gets its fire times computed once (``policies.plan_tick``, an RRULE's off the loop), its
overlap decision, and one variant of ``queries.TickWrite`` (one per schedule when it jitters).
Python work per schedule is list building only, unless the schedule has jitter."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache

from promptsched import offload
from promptsched.domain import DueGroup, RunStatus
from promptsched.schedule import jitter, overlap, policies
from promptsched.schedule.spec import Spec
from promptsched.store import queries


@lru_cache(maxsize=4096)
def _spec_of(kind: str, expression: str, timezone: str, gap: str, fold: str) -> Spec:
    return Spec(
        kind=kind,  # type: ignore[arg-type]  # the schema's CHECK constraints hold these
        expression=expression,
        timezone=timezone,
        dst_gap=gap,  # type: ignore[arg-type]
        dst_fold=fold,  # type: ignore[arg-type]
    )


@lru_cache(maxsize=1024)
def _misfire_of(
    policy: str, cap: int, window: timedelta | None, grace: timedelta
) -> policies.Misfire:
    return policies.Misfire(
        policy=policy,  # type: ignore[arg-type]  # checked by the schema's CHECK constraint
        cap=cap,
        catchup_window=window,
        grace=grace,
    )


def _spec(row: DueGroup) -> Spec:
    return _spec_of(row.kind, row.expression, row.timezone, row.dst_gap, row.dst_fold)


def _misfire(row: DueGroup) -> policies.Misfire:
    return _misfire_of(row.misfire_policy, row.misfire_cap, row.catchup_window, row.misfire_grace)


@dataclass
class BatchPlan:
    """The write of one batch, built group by group: a variant per group, or per schedule
    when the group has jitter (see ``queries.TickWrite``)."""

    schedules: int = 0
    planned: int = 0  # run rows planned, over all schedules
    dropped: Counter[str] = field(default_factory=Counter)
    plans: dict[tuple[Spec, datetime, datetime, policies.Misfire], policies.TickPlan] = field(
        default_factory=dict
    )
    variants: list[queries.Variant] = field(default_factory=list)
    owners: dict[int, str] = field(default_factory=dict)

    async def plan_off_loop(self, group: DueGroup) -> None:
        """An RRULE's plan is computed in a worker thread (bounded, but it may take tens of
        milliseconds); cron, `every` and `at` plan in closed form on the loop. A deadline
        raises TimeoutError, which fails the batch for the next tick to retry."""
        if group.kind != "rrule":
            return
        key = (_spec(group), group.next_fire_at, group.db_now, _misfire(group))
        if key not in self.plans:
            self.plans[key] = await offload.run(
                lambda: policies.plan_tick(*key), field=None, lane="scheduler"
            )

    def add_group(self, group: DueGroup) -> None:
        members = group.ids
        self.owners.update(zip(members, group.owners, strict=False))
        key = (_spec(group), group.next_fire_at, group.db_now, _misfire(group))
        plan = self.plans.get(key)
        if plan is None:  # groups that differ only in overlap or copied columns share it
            plan = self.plans[key] = policies.plan_tick(*key)
        # Unfinished runs matter only to a plan that starts a run (cancel_other cancels them
        # only for a newer run that takes their place).
        starts = any(run.status is RunStatus.PENDING for run in plan.runs)
        decision = overlap.apply(
            group.overlap_policy,  # type: ignore[arg-type]  # the schema CHECK holds these
            pending=group.unfinished if starts else 0,
            running=0,
            planned=plan.runs,
        )
        self.schedules += len(members)
        self.planned += len(decision.runs) * len(members)
        for reason, number in plan.dropped.items():
            self.dropped[reason] += number * len(members)
        spread = group.jitter
        if not spread:
            self.variants.append(_variant(group, members, plan, decision, None))
            return
        for sid in members:  # jitter hashes (schedule, slot): one variant per schedule
            self.variants.append(_variant(group, [sid], plan, decision, spread))

    def write(self) -> queries.TickWrite:
        return queries.TickWrite(self.variants, self.owners)


def _variant(
    group: DueGroup,
    members: list[int],
    plan: policies.TickPlan,
    decision: overlap.OverlapDecision,
    spread: timedelta | None,
) -> queries.Variant:
    """The variant ``members`` follow; with ``spread``, jittered for its one schedule."""
    runs = []
    for run in decision.runs:
        delay = jitter.offset(members[0], run.slot, spread) if spread else None
        runs.append(
            queries.PlannedRun(
                slot=run.slot,
                status=run.status,
                skip_reason=run.skip_reason,
                missed=run.missed,
                available_at=run.slot + delay if delay else run.slot,
            )
        )
    return queries.Variant(
        schedule_ids=members,
        next_fire_at=plan.next_fire_at,
        cancel=decision.cancel_unfinished,
        provider=group.provider,
        max_attempts=group.max_attempts,
        overlap_policy=group.overlap_policy,
        runs=runs,
    )
