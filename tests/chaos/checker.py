"""The invariant checker of a chaos run: evidence from the database, the webhook sink and the
processes' logs, and one function per promise, each returning (name, held, detail)."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from promptsched.schedule import fire_times
from promptsched.schedule.spec import Spec
from promptsched.store.pool import Conn
from tests.fakes.http_sink import SinkRequest

TERMINAL = ("succeeded", "dead", "cancelled", "skipped")
# Log events of a role that failed a round trip and will retry.
RETRY_EVENTS = frozenset({
    "role.error", "heartbeat.failed", "worker.claim_failed", "listen.connect_failed",
    "listen.connection_lost", "listen.subscribe_failed", "attempt.finalize_failed",
})  # fmt: skip
# A process may log this many retry lines in one second before it counts as a busy loop.
BUSY_LOOP_LINES_PER_SECOND = 40
# An attempt whose claim a database crash lost is fenced once Postgres is back (down at most
# 3 s in the injector) by its next renewal (every heartbeat) or its final write: well within.
LOST_CLAIM_FENCED_WITHIN = timedelta(seconds=10)
_KEY = re.compile(r"^promptsched-(\d+)-(succeeded|dead|paused)-(webhook|email)$")


@dataclass(frozen=True)
class Invariant:
    name: str
    held: bool
    detail: str


@dataclass
class Logs:
    """What the processes said, over every incarnation's log file."""

    events: Counter[str] = field(default_factory=Counter)
    # run, attempt, reason, when it was logged
    fenced: list[tuple[int, str, str, datetime]] = field(default_factory=list)
    succeeded: Counter[int] = field(default_factory=Counter)  # run.succeeded lines per run
    unparsed: list[str] = field(default_factory=list)  # stray output, e.g. a raw traceback
    busiest_second: tuple[int, str] = (0, "")  # retry lines in one process-second, where

    @classmethod
    def scan(cls, paths: Iterable[Path]) -> Logs:
        logs = cls()
        for path in paths:
            per_second: Counter[str] = Counter()
            for line in path.read_text(errors="replace").splitlines():
                if not line.startswith("{"):
                    if line.strip():
                        logs.unparsed.append(f"{path.name}: {line[:200]}")
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    logs.unparsed.append(f"{path.name}: {line[:200]}")
                    continue
                logs._add(event, per_second)
            if per_second:
                second, lines = per_second.most_common(1)[0]
                if lines > logs.busiest_second[0]:
                    logs.busiest_second = (lines, f"{path.name} at {second}")
        return logs

    def _add(self, event: Mapping[str, Any], per_second: Counter[str]) -> None:
        name = str(event.get("event"))
        self.events[name] += 1
        if name == "attempt.fenced":
            self.fenced.append((
                int(event["run_id"]), str(event["attempt_id"]), event["reason"],
                datetime.fromisoformat(event["timestamp"]),
            ))  # fmt: skip
        elif name == "run.succeeded":
            self.succeeded[int(event["run_id"])] += 1
        if name in RETRY_EVENTS:
            per_second[str(event.get("timestamp", ""))[:19]] += 1


@dataclass
class Evidence:
    schedules: list[asyncpg.Record]
    windows: Mapping[int, tuple[datetime, datetime | None]]  # schedule -> [first slot, end)
    runs: list[asyncpg.Record]
    attempts: list[asyncpg.Record]
    outbox: list[asyncpg.Record]
    deliveries: Sequence[SinkRequest]
    logs: Logs
    crashes: Sequence[str]
    exit_codes: Sequence[int]
    settled_in: float | None  # seconds until nothing was left to do; None: never
    db_crashes: Sequence[datetime] = ()  # when Postgres was stopped `immediate`

    @classmethod
    async def collect(cls, conn: Conn, ids: Sequence[int], **rest: Any) -> Evidence:
        schedules = await conn.fetch("SELECT * FROM schedules WHERE id = ANY($1)", ids)
        runs = await conn.fetch(
            "SELECT * FROM runs WHERE schedule_id = ANY($1) ORDER BY schedule_id, slot, id", ids
        )
        attempts = await conn.fetch(
            "SELECT a.* FROM run_attempts a JOIN runs r ON r.id = a.run_id "
            "WHERE r.schedule_id = ANY($1) ORDER BY a.run_id, a.number",
            ids,
        )
        outbox = await conn.fetch("SELECT * FROM outbox WHERE schedule_id = ANY($1)", ids)
        return cls(schedules, runs=runs, attempts=attempts, outbox=outbox, **rest)


def _spec(row: asyncpg.Record) -> Spec:
    return Spec(row["kind"], row["expression"], row["timezone"], row["dst_gap"], row["dst_fold"])


def slot_problems(
    row: asyncpg.Record, start: datetime, end: datetime | None, runs: list[asyncpg.Record]
) -> list[str]:
    """Walk the schedule's fire times in [start, end): each has its own row, or is one of the
    ``missed_slots`` a later coalesced row stands for, right before it. Nothing else."""
    if end is None:
        return [f"schedule {row['id']}: the window never closed"]
    slots = []
    for slot in fire_times.iter_after(_spec(row), start - timedelta(microseconds=1)):
        if slot >= end:
            break
        slots.append(slot)
    by_slot: dict[datetime, list[asyncpg.Record]] = defaultdict(list)
    for run in runs:
        by_slot[run["slot"]].append(run)
    problems = [
        f"schedule {row['id']}: {len(rows)} rows for slot {slot.isoformat()}"
        for slot, rows in by_slot.items()
        if len(rows) > 1
    ]
    problems += [
        f"schedule {row['id']}: run {rows[0]['id']} at {slot.isoformat()}, not a slot in window"
        for slot, rows in by_slot.items()
        if slot not in set(slots)
    ]
    uncovered = 0
    for slot in slots:
        if slot not in by_slot:
            uncovered += 1
            continue
        missed = by_slot[slot][0]["missed_slots"]
        if missed != uncovered:
            problems.append(
                f"schedule {row['id']}: row at {slot.isoformat()} stands for {missed} missed "
                f"slots, {uncovered} had no row before it"
            )
        uncovered = 0
    if uncovered:
        problems.append(f"schedule {row['id']}: the last {uncovered} slots have no row")
    return problems


def one_row_per_slot(ev: Evidence) -> Invariant:
    runs_of: dict[int, list[asyncpg.Record]] = defaultdict(list)
    for run in ev.runs:
        if run["origin"] == "cadence":
            runs_of[run["schedule_id"]].append(run)
    problems: list[str] = []
    slots = coalesced = 0
    for row in ev.schedules:
        start, end = ev.windows[row["id"]]
        runs = runs_of[row["id"]]
        problems += slot_problems(row, start, end, runs)
        slots += len(runs) + sum(run["missed_slots"] for run in runs)
        coalesced += sum(run["missed_slots"] for run in runs)
    detail = f"{slots} slots in {len(ev.schedules)} schedules, {coalesced} coalesced by misfire"
    return _result("every slot has exactly one run row", problems, detail)


def every_run_finished(ev: Evidence) -> Invariant:
    problems = []
    statuses: Counter[str] = Counter()
    for run in ev.runs:
        status = run["status"]
        statuses[status] += 1
        if status not in TERMINAL:
            problems.append(f"run {run['id']} is {status}")
        elif status == "skipped" and not run["skip_reason"]:
            problems.append(f"run {run['id']} skipped without a reason")
        elif status in ("dead", "cancelled") and not run["error"]:
            problems.append(f"run {run['id']} {status} without an error")
        elif status == "succeeded" and run["output"] is None:
            problems.append(f"run {run['id']} succeeded without output")
    detail = ", ".join(f"{statuses[s]} {s}" for s in (*TERMINAL, "pending", "running"))
    return _result(
        "every run ended succeeded, dead, cancelled or skipped with a reason", problems, detail
    )


def no_run_succeeded_twice(ev: Evidence) -> Invariant:
    succeeded_attempts: dict[int, list[asyncpg.Record]] = defaultdict(list)
    for attempt in ev.attempts:
        if attempt["status"] == "succeeded":
            succeeded_attempts[attempt["run_id"]].append(attempt)
    problems = []
    winners = 0
    for run in ev.runs:
        won = succeeded_attempts.get(run["id"], [])
        if run["status"] == "succeeded":
            winners += 1
            if len(won) != 1 or won[0]["attempt_id"] != run["attempt_id"]:
                problems.append(
                    f"run {run['id']}: {len(won)} succeeded attempts, "
                    f"winner {run['attempt_id']} vs {[str(a['attempt_id']) for a in won]}"
                )
        elif won:
            problems.append(f"run {run['id']} is {run['status']} but has a succeeded attempt")
    known = {run["id"]: run["status"] for run in ev.runs}
    for run_id, lines in ev.logs.succeeded.items():
        if lines > 1:
            problems.append(f"run {run_id}: run.succeeded logged {lines} times")
        if known.get(run_id, "succeeded") != "succeeded":
            problems.append(f"run {run_id}: logged succeeded, stored {known[run_id]}")
    detail = f"{winners} succeeded runs, each with one winning attempt"
    return _result("no run succeeded twice", problems, detail)


def _sink_by_key(ev: Evidence) -> dict[str, list[SinkRequest]]:
    by_key: dict[str, list[SinkRequest]] = defaultdict(list)
    for request in ev.deliveries:
        by_key[request.headers.get("Idempotency-Key", "")].append(request)
    return by_key


def every_finish_delivered(ev: Evidence) -> Invariant:
    by_key = _sink_by_key(ev)
    problems = []
    delivered = resent = 0
    for run in ev.runs:
        if run["status"] not in ("succeeded", "dead"):
            continue
        key = f"promptsched-{run['id']}-{run['status']}-webhook"
        accepted = [r for r in by_key.get(key, []) if 200 <= r.status < 300]
        if not accepted:
            problems.append(f"run {run['id']} ({run['status']}) was never delivered")
            continue
        delivered += 1
        resent += len(accepted) - 1
    failed = sum(1 for r in ev.deliveries if not 200 <= r.status < 300)
    detail = (
        f"{delivered} runs delivered; {resent} re-sends of an accepted key, "
        f"{failed} sends refused by the sink and retried"
    )
    return _result("every succeeded (and dead) run was delivered", problems, detail)


def no_stray_delivery(ev: Evidence) -> Invariant:
    status = {run["id"]: run["status"] for run in ev.runs}
    problems = []
    keys_of_run: dict[int, set[str]] = defaultdict(set)
    for key, requests in _sink_by_key(ev).items():
        match = _KEY.match(key)
        if match is None:
            problems.append(f"a delivery with key {key!r}")
            continue
        run_id, event = int(match[1]), match[2]
        keys_of_run[run_id].add(key)
        if status.get(run_id) != event:
            problems.append(f"run {run_id} delivered as {event}, stored {status.get(run_id)}")
        for request in requests:
            body = request.json()
            if (body["run"]["id"], body["run"]["status"]) != (run_id, event):
                problems.append(f"key {key} carried run {body['run']}")
    for run_id, keys in keys_of_run.items():
        if len(keys) > 1:
            problems.append(f"run {run_id} delivered under {len(keys)} keys: {sorted(keys)}")
    detail = f"{len(keys_of_run)} runs delivered, one key each, matching the stored state"
    return _result("no delivery for a run that did not end that way, none twice", problems, detail)


def fenced_writes_rejected(ev: Evidence) -> Invariant:
    attempts = {str(a["attempt_id"]): a for a in ev.attempts}
    runs = {run["id"]: run for run in ev.runs}
    problems = []
    undone = 0
    for run_id, attempt_id, reason, fenced_at in ev.logs.fenced:
        attempt = attempts.get(attempt_id)
        if attempt is None:
            # A claim does not wait for its WAL flush (docs/reliability.md, "Which commits
            # wait"): one a database crash lost never was, and the attempt it started is fenced
            # by the next renewal or write, once Postgres is back. Only such an attempt may
            # have no row.
            within = LOST_CLAIM_FENCED_WITHIN
            if any(crash <= fenced_at <= crash + within for crash in ev.db_crashes):
                undone += 1
                continue
            problems.append(f"fenced attempt {attempt_id} of run {run_id} has no row")
            continue
        if attempt["status"] not in ("lost", "released"):
            problems.append(
                f"fenced ({reason}) attempt {attempt_id} of run {run_id} ended "
                f"{attempt['status']}: its write landed"
            )
        if runs[run_id]["attempt_id"] is not None and str(runs[run_id]["attempt_id"]) == attempt_id:
            problems.append(f"run {run_id} kept the state of fenced attempt {attempt_id}")
    by_run: dict[int, list[asyncpg.Record]] = defaultdict(list)
    for attempt in ev.attempts:
        by_run[attempt["run_id"]].append(attempt)
    for run in ev.runs:
        numbers = [a["number"] for a in by_run.get(run["id"], [])]
        if numbers != list(range(1, run["attempts"] + 1)):
            problems.append(f"run {run['id']}: attempts {numbers}, counter {run['attempts']}")
        for attempt in by_run.get(run["id"], [])[:-1]:
            if attempt["status"] not in ("failed", "lost", "released"):
                problems.append(
                    f"run {run['id']}: attempt {attempt['number']} of {run['attempts']} "
                    f"ended {attempt['status']} but a later attempt ran"
                )
    reasons = Counter(reason for _, _, reason, _ in ev.logs.fenced)
    lost = sum(1 for a in ev.attempts if a["status"] == "lost")
    detail = (
        f"{len(ev.logs.fenced)} fenced attempts ({dict(reasons)}) all rejected; "
        f"{lost} attempts reaped as lost; {undone} whose claim a database crash undid"
    )
    return _result("every fenced write was rejected", problems, detail)


def nothing_left_running(ev: Evidence) -> Invariant:
    problems = [
        f"run {r['id']} still {r['status']}" for r in ev.runs if r["status"] not in TERMINAL
    ]
    problems += [
        f"attempt {a['attempt_id']} of run {a['run_id']} still running"
        for a in ev.attempts
        if a["status"] == "running"
    ]
    problems += [
        f"notification {o['id']} {o['status']}" for o in ev.outbox if o["status"] != "sent"
    ]
    if ev.settled_in is None:
        problems.append("work was still left when the wait for it ran out")
    detail = (
        f"everything finished and every notification sent {ev.settled_in:.1f}s after "
        "the faults stopped"
        if ev.settled_in is not None
        else "did not settle"
    )
    return _result("nothing stayed running after the faults stopped", problems, detail)


def no_process_crashed(ev: Evidence) -> Invariant:
    problems = [*ev.crashes]
    problems += [f"a final SIGTERM exited {code}" for code in ev.exit_codes if code != 0]
    problems += [f"stray output {line}" for line in ev.logs.unparsed[:5]]
    detail = (
        f"{len(ev.exit_codes)} processes drained cleanly at the end; "
        f"{ev.logs.events['role.recovered']} role recoveries logged"
    )
    return _result("no process crashed; every role retried by itself", problems, detail)


def no_busy_loop(ev: Evidence) -> Invariant:
    lines, where = ev.logs.busiest_second
    problems = (
        [f"{lines} retry lines in one second ({where})"]
        if lines > BUSY_LOOP_LINES_PER_SECOND
        else []
    )
    retries = sum(ev.logs.events[name] for name in RETRY_EVENTS)
    detail = (
        f"{retries} retry lines in all, at most {lines} in one process-second "
        f"(bound {BUSY_LOOP_LINES_PER_SECOND})"
    )
    return _result("failing roles back off (no busy loop)", problems, detail)


CHECKS = (
    one_row_per_slot,
    every_run_finished,
    no_run_succeeded_twice,
    every_finish_delivered,
    no_stray_delivery,
    fenced_writes_rejected,
    nothing_left_running,
    no_process_crashed,
    no_busy_loop,
)


def check(ev: Evidence) -> list[Invariant]:
    return [fn(ev) for fn in CHECKS]


def _result(name: str, problems: list[str], detail: str) -> Invariant:
    if not problems:
        return Invariant(name, True, detail)
    shown = "; ".join(problems[:5])
    more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
    return Invariant(name, False, f"{len(problems)} violations: {shown}{more}")


def table(invariants: Sequence[Invariant]) -> str:
    width = max(len(inv.name) for inv in invariants)
    lines = [f"{'invariant'.ljust(width)}  held  detail", f"{'-' * width}  ----  ------"]
    for inv in invariants:
        mark = "yes " if inv.held else "NO  "
        lines.append(f"{inv.name.ljust(width)}  {mark}  {inv.detail}")
    return "\n".join(lines)
