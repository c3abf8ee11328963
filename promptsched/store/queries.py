"""One typed async function per named SQL query (``sql/queries/*.sql``), named alike."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from dataclasses import fields as dataclass_fields
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from asyncpg import Record

from promptsched.domain import (
    ClaimedRun,
    DueGroup,
    OutboxEvent,
    OwedNotification,
    ReapedRun,
    RunOrigin,
    RunStatus,
    Schedule,
    ScheduleInput,
)
from promptsched.store.sqlfiles import queries as _load

_Q = _load()


class DB(Protocol):
    """What a pool and a connection both offer."""

    async def fetch(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Record]: ...

    async def fetchrow(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Record | None: ...

    async def fetchval(
        self,
        query: str,
        *args: Any,
        column: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any: ...

    async def execute(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> str: ...


# --- schedules ------------------------------------------------------------------------------


# A ScheduleInput's columns in the order schedule_insert lists them and schedule_update sets
# them ($3..), each taken from the field of the same name (SCHEDULE_FIELD_OF renames) unless
# the caller gives it; tests/test_schedule_input.py holds both statements to these tuples.
SCHEDULE_EDITABLE = (
    "name", "kind", "expression", "timezone", "dst_gap", "dst_fold", "prompt", "provider",
    "model", "params", "misfire_policy", "misfire_cap", "misfire_grace", "catchup_window",
    "overlap_policy", "max_attempts", "timeout", "jitter", "output_schema", "notify_when",
    "give_up_after", "fallback",
)  # fmt: skip
SCHEDULE_INSERT_COLUMNS = (
    "owner",
    *SCHEDULE_EDITABLE,
    "enabled",
    "next_fire_at",
    "pause_after_failures",
    "notify",
    "budget",
    "vars",
    "followup_key",
)
SCHEDULE_UPDATE_COLUMNS = (
    *SCHEDULE_EDITABLE,
    "next_fire_at",
    "pause_after_failures",
    "notify",
    "budget",
)
SCHEDULE_FIELD_OF = {"misfire_policy": "misfire", "overlap_policy": "overlap"}


def _schedule_params(
    values: ScheduleInput, columns: Sequence[str], given: Mapping[str, Any]
) -> list[Any]:
    """The statement's parameters for ``columns``: ``given`` first, else the input's field."""
    params: list[Any] = []
    for column in columns:
        value = (
            given[column]
            if column in given
            else getattr(values, SCHEDULE_FIELD_OF.get(column, column))
        )
        params.append(dict(value) if isinstance(value, Mapping) else value)
    return params


_SCHEDULE_FIELDS = tuple(f.name for f in dataclass_fields(Schedule))


def _schedule(row: Record) -> Schedule:
    """The one conversion of a ``schedules`` row (every column, by name)."""
    return Schedule(**{name: row[name] for name in _SCHEDULE_FIELDS})


def _maybe_schedule(row: Record | None) -> Schedule | None:
    return None if row is None else _schedule(row)


async def schedule_insert(
    db: DB, values: ScheduleInput, *, owner: str, next_fire_at: datetime | None
) -> Schedule:
    params = _schedule_params(
        values, SCHEDULE_INSERT_COLUMNS, {"owner": owner, "next_fire_at": next_fire_at}
    )
    row = await db.fetchrow(_Q["schedule_insert"], *params)
    assert row is not None
    return _schedule(row)


async def schedule_get(db: DB, schedule_id: int, owner: str | None) -> Schedule | None:
    return _maybe_schedule(await db.fetchrow(_Q["schedule_get"], schedule_id, owner))


class DueBatch(list[DueGroup]):
    """The groups of due schedules one batch locked, plus ``claimable``: how many due schedules
    it could have taken had no other scheduler held any (capped at what it asked for)."""

    def __init__(self, groups: list[DueGroup], claimable: int) -> None:
        super().__init__(groups)
        self.claimable = claimable

    @property
    def taken(self) -> int:
        return sum(len(group.ids) for group in self)

    @property
    def contended(self) -> int:
        """Due schedules this batch could have taken, but another transaction held."""
        return max(0, self.claimable - self.taken)


async def schedule_plan_fresh(db: DB) -> None:
    """Plan the next statements of this transaction for their own parameters (see the SQL)."""
    await db.execute(_Q["schedule_plan_fresh"])


async def schedule_plan_cached(db: DB) -> None:
    """Back to cached plans for the rest of this transaction."""
    await db.execute(_Q["schedule_plan_cached"])


async def schedule_take_due(db: DB, now: datetime | None, limit: int, held: int = 0) -> DueBatch:
    """Lock up to ``limit`` due schedules: one row per group that plans alike, with its ids.
    ``held``: due schedules this process's own other batches hold now (not contention). Run
    it inside the batch's transaction: the take is planned afresh for each batch there."""
    await schedule_plan_fresh(db)
    found = await db.fetch(_Q["schedule_take_due"], now, limit, held)
    await schedule_plan_cached(db)
    claimable: int = found[0]["claimable"] if found else 0
    return DueBatch([_due_group(row) for row in found if row["ids"] is not None], claimable)


def _due_group(row: Record) -> DueGroup:
    return DueGroup(
        ids=row["ids"],
        kind=row["kind"],
        expression=row["expression"],
        timezone=row["timezone"],
        dst_gap=row["dst_gap"],
        dst_fold=row["dst_fold"],
        next_fire_at=row["next_fire_at"],
        misfire_policy=row["misfire_policy"],
        misfire_cap=row["misfire_cap"],
        misfire_grace=row["misfire_grace"],
        catchup_window=row["catchup_window"],
        overlap_policy=row["overlap_policy"],
        jitter=row["jitter"],
        provider=row["provider"],
        max_attempts=row["max_attempts"],
        unfinished=row["unfinished"],
        db_now=row["db_now"],
        owners=row["owners"],
    )


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """One run row a tick writes for a slot: ``pending`` (from ``available_at``, the slot plus
    any jitter) or ``skipped`` with its reason; ``missed`` counts the slots it stands for."""

    slot: datetime
    status: RunStatus
    skip_reason: str | None
    missed: int
    available_at: datetime


@dataclass(frozen=True, slots=True)
class Variant:
    """What a set of schedules in one batch have in common: their new cursor (None: never
    fires again), whether their unfinished runs are cancelled (overlap cancel_other), the
    columns their runs copy, and the run rows each of them gets."""

    schedule_ids: Sequence[int]
    next_fire_at: datetime | None
    cancel: bool
    provider: str
    max_attempts: int
    overlap_policy: str
    runs: Sequence[PlannedRun]


@dataclass(frozen=True, slots=True)
class TickWrite:
    """One batch for ``schedule_tick``: every schedule it locked follows exactly one variant."""

    variants: Sequence[Variant]
    owners: Mapping[int, str] = dataclass_field(
        default_factory=dict
    )  # each schedule's; '' when unknown

    def owner_array(self) -> list[str]:
        """$16: the owner of each schedule of ``arrays()``'s $2, in its order."""
        owners = self.owners
        return [owners.get(sid, "") for variant in self.variants for sid in variant.schedule_ids]

    @property
    def schedule_ids(self) -> list[int]:
        return [sid for variant in self.variants for sid in variant.schedule_ids]

    def arrays(self) -> tuple[list[Any], ...]:
        """The statement's parameters $2..$14: the one place the named structures become the
        parallel arrays ``unnest`` reads (variants numbered from 1, as WITH ORDINALITY does)."""
        ids: list[int] = []
        of: list[int] = []
        cursor: list[datetime | None] = []
        cancel: list[bool] = []
        provider: list[str] = []
        max_attempts: list[int] = []
        overlap_policy: list[str] = []
        row_variant: list[int] = []
        slot: list[datetime] = []
        status: list[str] = []
        skip_reason: list[str | None] = []
        missed: list[int] = []
        available_at: list[datetime] = []
        for number, variant in enumerate(self.variants, start=1):
            ids.extend(variant.schedule_ids)
            of.extend([number] * len(variant.schedule_ids))
            cursor.append(variant.next_fire_at)
            cancel.append(variant.cancel)
            provider.append(variant.provider)
            max_attempts.append(variant.max_attempts)
            overlap_policy.append(variant.overlap_policy)
            for run in variant.runs:
                row_variant.append(number)
                slot.append(run.slot)
                status.append(run.status)
                skip_reason.append(run.skip_reason)
                missed.append(run.missed)
                available_at.append(run.available_at)
        return (
            ids,
            of,
            cursor,
            cancel,
            provider,
            max_attempts,
            overlap_policy,
            row_variant,
            slot,
            status,
            skip_reason,
            missed,
            available_at,
        )


async def schedule_tick(
    db: DB, now: datetime | None, write: TickWrite, *, all_rows: bool, runs_per_minute: int = 0
) -> Record:
    """Advance the cursors and insert the run rows of a batch locked by schedule_take_due;
    ``runs_per_minute``: the owners' quota (0: none), past which runs wait a minute."""
    row = await db.fetchrow(
        _Q["schedule_tick"], now, *write.arrays(), all_rows, write.owner_array(), runs_per_minute
    )
    assert row is not None
    return row


async def schedule_seconds_until_due(db: DB, now: datetime | None) -> float | None:
    value: float | None = await db.fetchval(_Q["schedule_seconds_until_due"], now)
    return value


async def schedule_count_owned(db: DB, owner: str) -> int:
    """Call it after schedule_lock_owner, in the same transaction."""
    count: int = await db.fetchval(_Q["schedule_count_owned"], owner)
    return count


async def schedule_lock_owner(db: DB, owner: str) -> None:
    """The owner's transaction lock on creating schedules (held until the commit)."""
    await db.execute(_Q["schedule_lock_owner"], owner)


async def schedule_name_claim(db: DB, owner: str, name: str, schedule_id: int) -> int:
    """The schedule that holds ``name`` under ``owner`` afterwards: ``schedule_id`` unless
    another has it (then nothing changed)."""
    holder: int = await db.fetchval(_Q["schedule_name_claim"], owner, name, schedule_id)
    return holder


async def schedule_take_pause_ended(db: DB, now: datetime | None, limit: int) -> list[Record]:
    """Schedules whose "pause until" ran out, locked for schedule_end_pauses."""
    return await db.fetch(_Q["schedule_take_pause_ended"], now, limit)


@dataclass(frozen=True, slots=True)
class PauseEnds:
    """The write of schedule_end_pauses: each schedule's new cursor, and the skipped rows of
    the slots inside its pause."""

    schedule_ids: list[int] = dataclass_field(default_factory=list)
    cursors: list[datetime | None] = dataclass_field(default_factory=list)
    run_schedule_ids: list[int] = dataclass_field(default_factory=list)
    slots: list[datetime] = dataclass_field(default_factory=list)
    missed: list[int] = dataclass_field(default_factory=list)


async def schedule_end_pauses(db: DB, now: datetime | None, ends: PauseEnds) -> list[Record]:
    """``(id, skipped)`` of each schedule resumed (one whose pause was changed meanwhile is
    missing: it is no longer due)."""
    return await db.fetch(
        _Q["schedule_end_pauses"], now, ends.schedule_ids, ends.cursors,
        ends.run_schedule_ids, ends.slots, ends.missed,
    )  # fmt: skip


async def schedule_get_for_update(db: DB, schedule_id: int, owner: str | None) -> Schedule | None:
    return _maybe_schedule(await db.fetchrow(_Q["schedule_get_for_update"], schedule_id, owner))


async def schedule_update(
    db: DB, schedule_id: int, version: int, values: ScheduleInput, *, next_fire_at: datetime | None
) -> Schedule | None:
    """None when the version moved on (another editor won)."""
    params = _schedule_params(values, SCHEDULE_UPDATE_COLUMNS, {"next_fire_at": next_fire_at})
    return _maybe_schedule(await db.fetchrow(_Q["schedule_update"], schedule_id, version, *params))


async def schedule_pause(
    db: DB, schedule_id: int, owner: str | None, until: datetime | None, reason: str | None
) -> Schedule | None:
    return _maybe_schedule(
        await db.fetchrow(_Q["schedule_pause"], schedule_id, owner, until, reason)
    )


async def schedule_resume(db: DB, schedule_id: int, owner: str | None) -> Schedule | None:
    return _maybe_schedule(await db.fetchrow(_Q["schedule_resume"], schedule_id, owner))


async def schedule_pause_if_failing(
    db: DB, schedule_id: int, run_id: int, now: datetime | None
) -> Record | None:
    """Pause, history row and the owner's "paused" messages in one statement; None when the
    schedule is not failing (nothing was written)."""
    return await db.fetchrow(_Q["schedule_pause_if_failing"], schedule_id, run_id, now)


async def schedule_pause_unplannable(db: DB, schedule_ids: Sequence[int], reason: str) -> int:
    count: int = await db.fetchval(_Q["schedule_pause_unplannable"], schedule_ids, reason)
    return count


async def schedule_change_insert(
    db: DB, schedule_id: int, owner: str, actor: str, action: str, changes: dict[str, Any]
) -> None:
    await db.execute(_Q["schedule_change_insert"], schedule_id, owner, actor, action, changes)


async def schedule_delete(db: DB, schedule_id: int, owner: str | None) -> bool:
    return await db.fetchval(_Q["schedule_delete"], schedule_id, owner) is not None


async def schedule_notify_changed(db: DB, schedule_id: int) -> None:
    await db.execute(_Q["schedule_notify_changed"], str(schedule_id))


# --- runs -----------------------------------------------------------------------------------


async def run_insert_manual(db: DB, schedule_id: int, now: datetime | None) -> Record | None:
    return await db.fetchrow(_Q["run_insert_manual"], schedule_id, now)


async def run_insert_backfill(
    db: DB, schedule_id: int, slots: Sequence[datetime], now: datetime | None
) -> list[Record]:
    return await db.fetch(_Q["run_insert_backfill"], schedule_id, slots, now)


async def run_previous_success(
    db: DB, schedule_id: int, slot: datetime, chars: int
) -> Record | None:
    """``finished_at``, ``slot``, the first ``chars`` of ``output`` and ``output_chars``."""
    return await db.fetchrow(_Q["run_previous_success"], schedule_id, slot, chars)


class Claim(list[ClaimedRun]):
    """The runs one claim got, plus ``claimable``: how many it could have taken had no other
    claimer held any (capped at what it asked for)."""

    def __init__(self, rows: list[ClaimedRun], claimable: int) -> None:
        super().__init__(rows)
        self.claimable = claimable

    @property
    def contended(self) -> int:
        """Runs this claim wanted and could have taken, but another transaction held."""
        return max(0, self.claimable - len(self))


def _claimed_run(row: Record) -> ClaimedRun:
    return ClaimedRun(
        id=row["id"],
        schedule_id=row["schedule_id"],
        slot=row["slot"],
        attempt_id=row["attempt_id"],
        attempts=row["attempts"],
        releases=row["releases"],
        max_attempts=row["max_attempts"],
        name=row["name"],
        prompt=row["prompt"],
        model=row["model"],
        params=row["params"],
        timezone=row["timezone"],
        enabled=row["enabled"],
        timeout_seconds=row["timeout_seconds"],
        start_lag=row["start_lag"],
        over_budget=row["over_budget"],
        vars=row["vars"],
        followup_key=row["followup_key"],
        output_schema=row["output_schema"],
        notify_when=row["notify_when"],
        throttles=row["throttles"],
        route=row["route"],
        fallback=tuple(row["fallback"] or ()),
        schedule_provider=row["schedule_provider"],
        schedule_model=row["schedule_model"],
        give_up_seconds=row["give_up_seconds"],
        running_for=row["running_for"] or 0.0,
    )


_SIZE_CLASS = "LIMIT $3 /* size class */"


def _claim_sql(text: str, limit: int) -> str:
    """The claim for up to ``limit`` runs, its candidates' LIMIT written in as ``limit``
    rounded up to a power of two (its size class); the update still takes ``limit`` ($3).

    A LIMIT that is a parameter makes every generic plan look dear to Postgres, so it
    planned every claim afresh: 0.35-0.5 ms of a 16-run claim's 1.5 ms. With the size in
    the text, each size class is its own prepared statement and keeps a generic plan, a
    handful per connection (1, 2, 4, ... up to the slots). The candidates are read lazily, so
    the update's own LIMIT $3 also bounds what is locked (docs/performance.md, "Planning")."""
    return _sized_claim(text, 1 << max(0, limit - 1).bit_length())


@functools.lru_cache(maxsize=64)
def _sized_claim(text: str, size: int) -> str:
    """Written once per statement and size class, not at every claim."""
    assert text.count(_SIZE_CLASS) == 1, "a claim statement without its size-class LIMIT"
    return text.replace(_SIZE_CLASS, f"LIMIT {size}")


async def run_claim_batch(
    db: DB, now: datetime | None, provider: str, limit: int, worker_id: str, lease: timedelta
) -> Claim:
    sql = _claim_sql(_Q["run_claim_batch"], limit)
    found = await db.fetch(sql, now, provider, limit, worker_id, lease)
    claimable: int = found[0]["claimable"] if found else 0
    return Claim([_claimed_run(row) for row in found if row["id"] is not None], claimable)


@dataclass(frozen=True, slots=True)
class ProviderRoom:
    """What a provider's fleet-wide limits left at a limited claim (``provider_admit``)."""

    allowed: int  # runs the claim could take
    running: int  # its calls in flight across the fleet (running runs less the claimer's returned)
    open_for: float  # seconds its breaker stays open (0: not open)
    half_open: bool  # one probe at a time
    failures: int  # retryable failures in a row
    llm_tokens: float | None = None  # its LLM-token bucket now (None: no tokens-per-minute)
    paced_for: float = 0.0  # seconds its own rate-limit headers said nothing is left
    ramp: float | None = None  # its allowed concurrency while it ramps back (None: the limit)
    rate: float | None = None  # requests a second its rate bucket refills (None: no rate)
    rate_tokens: float | None = None  # whole requests its rate bucket held before the claim


class LimitedClaim(Claim):
    """A claim under a provider's fleet-wide limits, with the room they left."""

    def __init__(self, rows: list[ClaimedRun], claimable: int, room: ProviderRoom) -> None:
        super().__init__(rows, claimable)
        self.room = room


async def run_claim_limited(
    db: DB,
    now: datetime | None,
    provider: str,
    limit: int,
    worker_id: str,
    lease: timedelta,
    *,
    max_concurrency: int,
    rate: float | None,
    burst: float,
    tokens_per_minute: int | None = None,
    returned: Sequence[int] = (),
    returned_attempts: Sequence[UUID] = (),
) -> LimitedClaim:
    """``returned``/``returned_attempts``: the claimer's runs whose call has returned and whose
    final write is on its way; the concurrency limit does not count them."""
    found = await db.fetch(
        _claim_sql(_Q["run_claim_limited"], limit), now, provider, limit, worker_id, lease,
        max_concurrency, rate, burst, tokens_per_minute,
        list(returned) if returned else None, list(returned_attempts) if returned else None,
    )  # fmt: skip
    first = found[0]
    room = ProviderRoom(
        first["allowed"], first["provider_running"], first["open_for"], first["half_open"],
        first["failures"], first["llm_tokens"], first["paced_for"], first["ramp"], first["rate"],
        first["rate_tokens"],
    )  # fmt: skip
    rows = [_claimed_run(row) for row in found if row["id"] is not None]
    return LimitedClaim(rows, first["claimable"], room)


@dataclass(frozen=True, slots=True)
class Trip:
    """What a failure did to the provider's breaker (``provider_trip``)."""

    open_until: datetime | None  # None: closed
    opened: bool  # this failure opened it (or opened it again)
    reason: str | None = None  # why it is open: "throttled", "5 failures in a row"


async def provider_trip(
    db: DB,
    now: datetime | None,
    provider: str,
    wait: float | None,
    *,
    started: datetime | None,
    throttled: bool,
    threshold: int,
    base: float,
    throttle_base: float,
    cap: float,
    window: float,
) -> Trip | None:
    """Count a retryable failure of an attempt that started at ``started``; None when it
    changed nothing (it started before the breaker last opened: the same burst). ``window``:
    the length of the window a throttle without a wait of its own ends."""
    row = await db.fetchrow(
        _Q["provider_trip"], now, provider, wait, threshold, base, cap, started, throttled,
        throttle_base, window,
    )  # fmt: skip
    return None if row is None else Trip(row["open_until"], bool(row["opened"]), row["reason"])


async def provider_recover(
    db: DB,
    provider: str,
    *,
    probe: bool,
    started: datetime | None,
    max_concurrency: int,
    now: datetime | None = None,
) -> float | None:
    """A success; the allowed concurrency afterwards while it ramps back (None: the limit)."""
    ramp: float | None = await db.fetchval(
        _Q["provider_recover"], provider, probe, started, max_concurrency, now
    )
    return ramp


async def provider_pace(
    db: DB, now: datetime | None, provider: str, seconds: float, why: str
) -> None:
    """No replica sends to ``provider`` for ``seconds`` (its rate-limit headers said so)."""
    await db.execute(_Q["provider_pace"], now, provider, seconds, why)


async def provider_debit_tokens(
    db: DB, now: datetime | None, provider: str, tokens_per_minute: int, used: int
) -> None:
    """Take the ``used`` tokens an attempt reported from the provider's LLM-token bucket."""
    await db.execute(_Q["provider_debit_tokens"], now, provider, tokens_per_minute, used)


async def provider_cooling(db: DB, now: datetime | None) -> list[Record]:
    return await db.fetch(_Q["provider_cooling"], now)


async def provider_weather(db: DB, now: datetime | None) -> list[Record]:
    return await db.fetch(_Q["provider_weather"], now)


async def run_heartbeat_many(
    db: DB,
    now: datetime | None,
    run_ids: Sequence[int],
    attempt_ids: Sequence[UUID],
    lease: timedelta,
) -> list[Record]:
    return await db.fetch(_Q["run_heartbeat_many"], now, run_ids, attempt_ids, lease)


@dataclass(frozen=True, slots=True)
class Finish:
    """One attempt's final write (see run_finish_many)."""

    run_id: int
    attempt_id: UUID
    status: str
    attempt_status: str
    output: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    retry_in: timedelta | None = None
    skip_reason: str | None = None
    notice: dict[str, Any] | None = None  # a reached budget the owner is told of (once)
    # a follow-up's check that ended: {"decision": {...} | None} (followup_record)
    check: dict[str, Any] | None = None
    output_json: Any = None  # a success's structured answer (a schedule with an output_schema)
    # a monitor's notification decision made by the worker ({"notify", "reason", "when"}), or
    # what a `changed` monitor's finish compares ({"fingerprint", "what"}: monitor_decide)
    decision: dict[str, Any] | None = None
    watch: dict[str, Any] | None = None
    provider: str | None = None  # the provider and model this attempt used
    model: str | None = None
    throttled: bool = False  # the provider said "not now": not counted against max_attempts
    wait: timedelta | None = None  # how long the provider asked it to wait
    # a retry moved to another place of the run's route: (route, provider, model)
    reroute: tuple[int, str, str | None] | None = None
    # characters replaced to make the attempt's text storable (promptsched/storable.py)
    cleaned: int | None = None


async def run_finish_many(
    db: DB, now: datetime | None, batch: Sequence[Finish], worker_id: str
) -> set[int]:
    """The run ids whose write landed; an id missing was fenced (its attempt is stale).
    ``worker_id`` is the worker whose attempts these are (the batch is one process's)."""
    row = await db.fetchrow(
        _Q["run_finish_many"],
        now,
        [f.run_id for f in batch],
        [f.attempt_id for f in batch],
        [f.status for f in batch],
        [f.output for f in batch],
        [f.usage for f in batch],
        [f.error for f in batch],
        [f.retry_in for f in batch],
        [f.skip_reason for f in batch],
        [f.attempt_status for f in batch],
        [f.notice for f in batch],
        [f.check for f in batch],
        worker_id,
        [f.output_json for f in batch],
        [f.decision for f in batch],
        [f.watch for f in batch],
        [f.provider for f in batch],
        [f.model for f in batch],
        [f.throttled for f in batch],
        [f.wait for f in batch],
        [f.reroute[0] if f.reroute else None for f in batch],
        [f.reroute[1] if f.reroute else None for f in batch],
        [f.reroute[2] if f.reroute else None for f in batch],
        [f.cleaned for f in batch],
    )
    assert row is not None
    return set(row["landed"])


async def run_release_many(
    db: DB,
    now: datetime | None,
    run_ids: Sequence[int],
    attempt_ids: Sequence[UUID],
    worker_id: str,
) -> int:
    count: int = await db.fetchval(_Q["run_release_many"], now, run_ids, attempt_ids, worker_id)
    return count


async def run_reap_expired(
    db: DB, now: datetime | None, limit: int, deadline_grace: timedelta
) -> list[ReapedRun]:
    rows = await db.fetch(_Q["run_reap_expired"], now, limit, deadline_grace)
    return [ReapedRun(**{**row, "status": RunStatus(row["status"])}) for row in rows]


async def run_analyze_outgrown(db: DB, written: int) -> float | None:
    """Analyze ``runs`` when its statistics know fewer rows than a rush has just written
    (``runs_analyze_outgrown``, migration 0018): the row count they knew then, or None when
    they knew enough and nothing was analyzed."""
    known: float | None = await db.fetchval(_Q["run_analyze_outgrown"], written)
    return known


async def run_seconds_until_available(
    db: DB, now: datetime | None, providers: Sequence[str]
) -> float | None:
    value: float | None = await db.fetchval(_Q["run_seconds_until_available"], now, providers)
    return value


async def run_reroute_held(
    db: DB, now: datetime | None, provider: str, limit: int, providers: Sequence[str]
) -> list[str]:
    """Move up to ``limit`` runs waiting for ``provider`` (its breaker open, or paced) to the
    next place of their route that can take them now; the providers they went to, one per
    run moved."""
    rows = await db.fetch(_Q["run_reroute_held"], now, provider, limit, providers)
    return [row["provider"] for row in rows]


async def run_notify_ready(db: DB, payload: str = "") -> None:
    await db.execute(_Q["run_notify_ready"], payload)


async def run_list(
    db: DB,
    *,
    schedule_id: int | None,
    status: str | None,
    owner: str | None,
    before_id: int | None,
    limit: int,
) -> list[Record]:
    return await db.fetch(_Q["run_list"], schedule_id, status, owner, before_id, limit)


async def run_get(db: DB, run_id: int, owner: str | None) -> Record | None:
    return await db.fetchrow(_Q["run_get"], run_id, owner)


async def run_output(db: DB, run_id: int, owner: str | None) -> Record | None:
    return await db.fetchrow(_Q["run_output"], run_id, owner)


async def run_attempts_list(db: DB, run_id: int) -> list[Record]:
    return await db.fetch(_Q["run_attempts_list"], run_id)


async def run_lost_among(db: DB, run_ids: list[int]) -> set[int]:
    return {row["run_id"] for row in await db.fetch(_Q["run_lost_among"], run_ids)}


async def run_seconds_until_lease_expiry(db: DB, now: datetime | None) -> float | None:
    value: float | None = await db.fetchval(_Q["run_seconds_until_lease_expiry"], now)
    return value


# --- agent runs -----------------------------------------------------------------------------


async def attempt_append_step(
    db: DB,
    now: datetime | None,
    run_id: int,
    attempt_id: UUID,
    step: dict[str, Any],
    event: str,
) -> bool:
    """False when the attempt is no longer running (nothing was written or published)."""
    rows = await db.fetch(_Q["attempt_append_step"], now, attempt_id, step, event, run_id)
    return bool(rows)


async def run_get_status(db: DB, run_id: int, owner: str | None) -> str | None:
    status: str | None = await db.fetchval(_Q["run_get_status"], run_id, owner)
    return status


# --- clock ----------------------------------------------------------------------------------


async def clock_now(db: DB, now: datetime | None) -> datetime:
    value: datetime = await db.fetchval(_Q["clock_now"], now)
    return value


# --- listen ---------------------------------------------------------------------------------


async def listen_check_notify(db: DB, token: str) -> None:
    await db.execute(_Q["listen_check_notify"], token)


# --- stats ----------------------------------------------------------------------------------


async def leader_acquire(
    db: DB, name: str, holder: str, ttl: timedelta, now: datetime | None
) -> int | None:
    """Take or renew duty ``name`` for ``holder`` until now + ``ttl``; the term number when
    ``holder`` leads, None while another holder's term has not expired."""
    number: int | None = await db.fetchval(_Q["leader_acquire"], name, holder, ttl, now)
    return number


async def leader_release(db: DB, name: str, holder: str) -> None:
    await db.execute(_Q["leader_release"], name, holder)


# --- the fleet (fleet.sql) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """What one replica publishes about itself (``replicas``)."""

    id: str
    host: str
    version: str
    roles: Sequence[str]
    slots: int
    config: Mapping[str, Any]
    fingerprint: str


async def replica_publish(
    db: DB, replica: ReplicaRow, in_flight: int, alive_for: timedelta, now: datetime | None
) -> None:
    await db.execute(
        _Q["replica_publish"], replica.id, replica.host, replica.version, list(replica.roles),
        replica.slots, dict(replica.config), replica.fingerprint, in_flight, alive_for, now,
    )  # fmt: skip


async def replica_stop(db: DB, replica_id: str, now: datetime | None) -> None:
    await db.execute(_Q["replica_stop"], replica_id, now)


async def replica_fingerprints(db: DB, now: datetime | None) -> list[Record]:
    return await db.fetch(_Q["replica_fingerprints"], now)


async def replica_list(db: DB, now: datetime | None, recent: timedelta) -> list[Record]:
    return await db.fetch(_Q["replica_list"], now, recent)


async def notify_url_targets(db: DB, limit: int) -> list[Record]:
    return await db.fetch(_Q["notify_url_targets"], limit)


async def notify_email_count(db: DB) -> int:
    count: int = await db.fetchval(_Q["notify_email_count"])
    return count


async def backend_pid(db: DB) -> int:
    pid: int = await db.fetchval(_Q["backend_pid"])
    return pid


async def stats_queue_depth(db: DB, now: datetime | None) -> Record:
    row = await db.fetchrow(_Q["stats_queue_depth"], now)
    assert row is not None
    return row


async def stats_pending_runs(db: DB, now: datetime | None) -> list[Record]:
    return await db.fetch(_Q["stats_pending_runs"], now)


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """A provider's fleet-wide limits, as the claim passes them to provider_admit."""

    max_concurrency: int
    rate: float | None
    burst: float
    tokens_per_minute: int | None


async def stats_provider_room(
    db: DB, now: datetime | None, wanted: Mapping[str, tuple[int, ProviderLimits]]
) -> list[Record]:
    names = sorted(wanted)
    limits = [wanted[name][1] for name in names]
    return await db.fetch(
        _Q["stats_provider_room"], now, names, [wanted[name][0] for name in names],
        [limit.max_concurrency for limit in limits], [limit.rate for limit in limits],
        [limit.burst for limit in limits], [limit.tokens_per_minute for limit in limits],
    )  # fmt: skip


async def stats_outbox_depth(db: DB) -> list[Record]:
    return await db.fetch(_Q["stats_outbox_depth"])


# --- outbox ---------------------------------------------------------------------------------


async def outbox_reclaim_expired(db: DB, now: datetime | None, limit: int) -> list[Record]:
    return await db.fetch(_Q["outbox_reclaim_expired"], now, limit)


async def outbox_claim_batch(
    db: DB, now: datetime | None, limit: int, lease: timedelta, max_attempts: int
) -> list[OwedNotification]:
    rows = await db.fetch(_Q["outbox_claim_batch"], now, limit, lease, max_attempts)
    return [
        OwedNotification(
            **{
                **row,
                "event": OutboxEvent(row["event"]),
                "origin": RunOrigin(row["origin"]),
                "run_status": RunStatus(row["run_status"]),
            }
        )
        for row in rows
    ]


async def outbox_owe_digests(db: DB, now: datetime | None, period: timedelta) -> Record:
    """Owe the digests of the last whole period: ``owed`` (outbox rows written) and
    ``seconds_to_next`` (until the next period ends)."""
    row: Record | None = await db.fetchrow(_Q["outbox_owe_digests"], now, period)
    assert row is not None  # one row always
    return row


async def outbox_settle_many(
    db: DB,
    now: datetime | None,
    ids: Sequence[int],
    claim_tokens: Sequence[UUID],
    statuses: Sequence[str],
    retry_in: Sequence[timedelta | None],
    errors: Sequence[str | None],
) -> list[Record]:
    """The rows whose claim was still ours; a missing id was fenced and changed nothing."""
    return await db.fetch(
        _Q["outbox_settle_many"], now, ids, claim_tokens, statuses, retry_in, errors
    )


async def outbox_seconds_until_work(db: DB, now: datetime | None) -> float | None:
    value: float | None = await db.fetchval(_Q["outbox_seconds_until_work"], now)
    return value


async def outbox_list_dead(
    db: DB, owner: str | None, before_id: int | None, limit: int
) -> list[Record]:
    return await db.fetch(_Q["outbox_list_dead"], owner, before_id, limit)


async def outbox_list_for_run(db: DB, run_id: int, owner: str | None) -> list[Record]:
    return await db.fetch(_Q["outbox_list_for_run"], run_id, owner)


async def outbox_get(db: DB, notification_id: int, owner: str | None) -> Record | None:
    return await db.fetchrow(_Q["outbox_get"], notification_id, owner)


async def outbox_replay(
    db: DB, now: datetime | None, notification_id: int, owner: str | None
) -> Record | None:
    """None unless the notification exists, is the owner's, and is dead."""
    return await db.fetchrow(_Q["outbox_replay"], now, notification_id, owner)


# --- tokens ---------------------------------------------------------------------------------


async def token_insert(
    db: DB, owner: str, admin: bool, token_hash: str, name: str | None
) -> Record:
    row = await db.fetchrow(_Q["token_insert"], owner, admin, token_hash, name)
    assert row is not None
    return row


async def token_authenticate(db: DB, token_hash: str, now: datetime | None) -> Record | None:
    """The live (unrevoked) token with this hash, or None."""
    return await db.fetchrow(_Q["token_authenticate"], token_hash, now)


async def token_list(db: DB, owner: str | None) -> list[Record]:
    return await db.fetch(_Q["token_list"], owner)


async def token_revoke(db: DB, token_id: int, now: datetime | None) -> Record | None:
    """None when there is no such live token."""
    return await db.fetchrow(_Q["token_revoke"], token_id, now)


async def console_session_start(
    db: DB, secret_hash: str, token_id: int, ttl: timedelta, now: datetime | None
) -> int | None:
    """The new session's id; None when the token was revoked meanwhile."""
    session_id: int | None = await db.fetchval(
        _Q["console_session_start"], secret_hash, token_id, ttl, now
    )
    return session_id


async def console_session_authenticate(
    db: DB, secret_hash: str, now: datetime | None
) -> Record | None:
    return await db.fetchrow(_Q["console_session_authenticate"], secret_hash, now)


async def console_session_end(db: DB, secret_hash: str, now: datetime | None) -> None:
    await db.execute(_Q["console_session_end"], secret_hash, now)


async def run_stream_check(
    db: DB,
    run_id: int,
    owner: str | None,
    token_id: int,
    session_id: int | None,
    now: datetime | None,
) -> Record:
    row = await db.fetchrow(_Q["run_stream_check"], run_id, owner, token_id, session_id, now)
    assert row is not None
    return row


# --- api ------------------------------------------------------------------------------------


async def schedule_search(
    db: DB,
    *,
    owner: str | None,
    enabled: bool | None,
    name: str | None,
    after_id: int,
    limit: int,
) -> list[Schedule]:
    found = await db.fetch(_Q["schedule_search"], owner, enabled, name, after_id, limit)
    return [_schedule(row) for row in found]


async def schedule_spend(db: DB, schedule_id: int, now: datetime | None) -> dict[str, Any]:
    """Tokens and cost of the schedule's runs in the current UTC day and month."""
    return _spend(await db.fetchrow(_Q["schedule_spend"], schedule_id, now))


def _spend(row: Record | None) -> dict[str, Any]:
    assert row is not None
    return {
        period: {"tokens": row[f"{period}_tokens"], "cost": row[f"{period}_cost"]}
        for period in ("day", "month")
    }


async def owner_spend(db: DB, owner: str, now: datetime | None) -> dict[str, Any]:
    """Tokens and cost of all the owner's runs in the current UTC day and month."""
    return _spend(await db.fetchrow(_Q["owner_spend"], owner, now))


async def owner_budget_get(db: DB, owner: str) -> dict[str, Any] | None:
    budget: dict[str, Any] | None = await db.fetchval(_Q["owner_budget_get"], owner)
    return budget


async def owner_budget_set(
    db: DB, owner: str, budget: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Sets the owner's budget (None removes it); returns the one now in force."""
    stored: dict[str, Any] | None = await db.fetchval(
        _Q["owner_budget_set"], owner, None if budget is None else dict(budget)
    )
    return stored


async def schedule_change_page(
    db: DB, schedule_id: int, owner: str | None, before_id: int | None, limit: int
) -> list[Record]:
    return await db.fetch(_Q["schedule_change_page"], schedule_id, owner, before_id, limit)


async def schedule_change_around(db: DB, schedule_id: int, at: datetime) -> list[Record]:
    return await db.fetch(_Q["schedule_change_around"], schedule_id, at)


async def run_list_for_slot(db: DB, schedule_id: int, slot: datetime) -> list[Record]:
    return await db.fetch(_Q["run_list_for_slot"], schedule_id, slot)


async def run_cancel(
    db: DB, run_id: int, owner: str | None, now: datetime | None, error: str
) -> Record | None:
    """None unless the run exists, is the owner's, and is pending or running."""
    return await db.fetchrow(_Q["run_cancel"], run_id, owner, now, error)


async def run_insert_replay(
    db: DB, run_id: int, owner: str | None, now: datetime | None
) -> Record | None:
    """None unless the run exists, is the owner's, is dead and was not replayed yet."""
    return await db.fetchrow(_Q["run_insert_replay"], run_id, owner, now)


async def run_get_replay(db: DB, run_id: int) -> Record | None:
    return await db.fetchrow(_Q["run_get_replay"], run_id)


# --- console --------------------------------------------------------------------------------


async def run_latest_finished_many(db: DB, schedule_ids: Sequence[int]) -> list[Record]:
    return await db.fetch(_Q["run_latest_finished_many"], list(schedule_ids))


async def run_dead_page(
    db: DB, owner: str | None, before_id: int | None, limit: int
) -> list[Record]:
    return await db.fetch(_Q["run_dead_page"], owner, before_id, limit)


async def run_purge_finished(db: DB, now: datetime | None, retention: timedelta, limit: int) -> int:
    count: int = await db.fetchval(_Q["run_purge_finished"], now, retention, limit)
    return count


# --- follow-ups -----------------------------------------------------------------------------


async def followup_get(db: DB, owner: str, key: str) -> Record | None:
    return await db.fetchrow(_Q["followup_get"], owner, key)


async def followup_lock_runs(db: DB, owner: str, key: str) -> None:
    await db.fetch(_Q["followup_lock_runs"], owner, key)


async def followup_lock(db: DB, owner: str, key: str) -> Record | None:
    """Locks the follow-up's unfinished runs, then its row (the finish's order)."""
    await followup_lock_runs(db, owner, key)
    return await db.fetchrow(_Q["followup_lock"], owner, key)


async def followup_insert(
    db: DB,
    schedule_id: int,
    *,
    owner: str,
    key: str,
    request: Mapping[str, Any],
    due_at: datetime,
    max_checks: int,
    horizon: datetime,
    escalate: Sequence[Mapping[str, Any]],
    resolution: timedelta | None,
) -> None:
    await db.execute(
        _Q["followup_insert"], schedule_id, owner, key, dict(request), due_at, max_checks,
        horizon, [dict(step) for step in escalate], resolution,
    )  # fmt: skip


async def followup_checks(db: DB, schedule_id: int) -> list[Record]:
    return await db.fetch(_Q["followup_checks"], schedule_id)


async def followup_list(
    db: DB, owner: str | None, state: str | None, before_id: int | None, limit: int
) -> list[Record]:
    return await db.fetch(_Q["followup_list"], owner, state, before_id, limit)


async def followup_cancel(db: DB, schedule_id: int, actor: str, now: datetime | None) -> int:
    stopped: int = await db.fetchval(_Q["followup_cancel"], schedule_id, actor, now)
    return stopped
