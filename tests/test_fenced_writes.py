"""Fenced writes count the writes a stale attempt (or an expired notification claim) tried and
the database rejected, by kind, apart from the leases lost: one lost lease may reject several
writes, and a rejected outbox mark loses no lease at all."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from promptsched import netguard
from promptsched.clock import Clock, FrozenClock
from promptsched.executors.base import Step
from promptsched.metrics import FENCED_WRITE_KINDS, LEASE_LOSS_CAUSES, Metrics
from promptsched.ops import notify_targets
from promptsched.roles.worker.heartbeat import Heartbeat
from promptsched.roles.worker.inflight import InFlight
from promptsched.roles.worker.transcript import AttemptLog
from promptsched.store import queries
from tests import factories
from tests.factories import EPOCH
from tests.fakes import serve
from tests.helpers import Service, wait_until


def _fenced(metrics: Metrics) -> dict[str, float]:
    return {kind: metrics.fenced_writes.labels(kind)._value.get() for kind in FENCED_WRITE_KINDS}


def _lost(metrics: Metrics) -> dict[str, float]:
    return {cause: metrics.leases_lost.labels(cause)._value.get() for cause in LEASE_LOSS_CAUSES}


async def test_a_rejected_finish_is_one_fenced_write_and_one_lost_lease(
    pool: asyncpg.Pool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    finish_many = queries.run_finish_many

    async def taken_first(db: Any, now: Any, batch: Any, worker_id: str) -> set[int]:
        # Another attempt won the run just before this one's final write (a reap, a re-claim).
        await pool.execute("UPDATE runs SET attempt_id = gen_random_uuid() WHERE id = $1", rid)
        return await finish_many(db, now, batch, worker_id)

    monkeypatch.setattr(queries, "run_finish_many", taken_first)
    metrics = Metrics()
    await factories.worker_pool(pool, FrozenClock(EPOCH), metrics).run_once()
    assert (await pool.fetchrow("SELECT status FROM runs WHERE id = $1", rid))[
        "status"
    ] == "running"
    assert _fenced(metrics) == {kind: 1 if kind == "finish" else 0 for kind in FENCED_WRITE_KINDS}
    assert sum(_lost(metrics).values()) == 1


async def test_a_transcript_append_by_a_lost_attempt_is_a_fenced_write(
    pool: asyncpg.Pool[Any],
) -> None:
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    [claimed] = await queries.run_claim_batch(pool, None, "echo", 1, "w", timedelta(seconds=30))
    metrics = Metrics()
    record = AttemptLog(
        pool, FrozenClock(EPOCH), metrics,
        run_id=rid, attempt_id=claimed.attempt_id, attempt=1,
    ).record  # fmt: skip
    step = Step(kind="model", number=1, max_steps=4, text="thinking", tokens=3, detail={})
    await record(step)
    assert _fenced(metrics)["transcript"] == 0
    # The reaper takes the run back from this attempt (its lease expired).
    await pool.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second'")
    assert [r.id for r in await queries.run_reap_expired(pool, None, 10, timedelta(0))] == [rid]
    await record(step)
    await record(step)
    assert _fenced(metrics)["transcript"] == 2  # two writes tried, two rejected
    assert sum(_lost(metrics).values()) == 0  # the transcript does not decide the lease
    transcript = await pool.fetchval(
        "SELECT transcript FROM run_attempts WHERE attempt_id = $1", claimed.attempt_id
    )
    assert len(transcript) == 1


async def test_a_heartbeat_in_flight_across_a_pause_reads_its_answer_not_a_timeout(
    dsn: str, pool: asyncpg.Pool[Any]
) -> None:
    # The process stands still (SIGSTOP, a paused VM) while its heartbeat waits on the row,
    # longer than a lease. When it runs again, the answer says the run was taken over: the
    # lease expired, and the rejected heartbeat is a fenced write. The database never stopped
    # answering, so this is not ``unreachable`` (what a deadline in wall time would decide
    # the moment the process resumed, before reading the answer).
    rid = await factories.pending_run(pool, await factories.schedule(pool))
    [claimed] = await queries.run_claim_batch(pool, None, "echo", 1, "w", timedelta(seconds=30))
    metrics = Metrics()
    lease = timedelta(seconds=2)
    heartbeat = Heartbeat(pool, Clock(), metrics, lease=lease, interval=timedelta(milliseconds=100))
    attempt = InFlight(rid, claimed.attempt_id, "echo", None)
    heartbeat.inflight.add(attempt)

    async def heartbeat_waits_on_the_row() -> bool:
        waiting: int = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%UPDATE runs%'"
        )
        return waiting == 1

    async def fenced() -> bool:
        return attempt.fenced

    rescuer = await asyncpg.connect(dsn)
    try:
        # Another process's takeover holds the row until it commits.
        takeover = rescuer.transaction()
        await takeover.start()
        await rescuer.execute("UPDATE runs SET attempt_id = gen_random_uuid() WHERE id = $1", rid)
        async with anyio.create_task_group() as tg:
            await tg.start(heartbeat.run)
            await wait_until(heartbeat_waits_on_the_row, timeout=10, what="the heartbeat to wait")
            tg.start_soon(takeover.commit)  # sent once the loop runs again
            time.sleep(lease.total_seconds() * 1.5)  # noqa: ASYNC251 - the loop stands still
            await wait_until(fenced, timeout=10, what="the heartbeat to learn the lease is gone")
            tg.cancel_scope.cancel()
    finally:
        await rescuer.close()
    assert _lost(metrics) == {"expired": 1, "taken": 0, "unreachable": 0}
    assert _fenced(metrics) == {k: 1 if k == "heartbeat" else 0 for k in FENCED_WRITE_KINDS}
    assert metrics.role_errors.labels("heartbeat")._value.get() == 0


# --- a real process frozen past its leases ----------------------------------------------------


@dataclass
class HeldHook:
    """A webhook receiver that holds the first request until released, answers the rest."""

    url: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    keys: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.keys.append(request.headers.get("Idempotency-Key", ""))
        if len(self.keys) == 1:
            self.arrived.set()
            await self.release.wait()
        return web.Response(text="ok")


@asynccontextmanager
async def _held_hook() -> AsyncIterator[HeldHook]:
    hook = HeldHook()
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    async with serve(app, release=hook.release, shutdown_timeout=0.1) as base_url:
        hook.url = f"{base_url}/hook"
        yield hook


async def _scrape(service: Service) -> dict[tuple[str, str], float]:
    port = service.has_event("api.listening")["port"]  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("promptsched_fenced_writes_total", "promptsched_leases_lost_total"):
                label = sample.labels.get("kind") or sample.labels.get("cause", "")
                found[(sample.name, label)] = sample.value
    return found


def _delta(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> Any:
    return {
        key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key)
    }


@pytest.mark.slow
async def test_sigstop_past_the_leases_counts_each_rejected_write_not_each_fence(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    # The frozen process holds a run (its attempt) and a notification claim (a send in
    # flight) when it stops. Another process takes both over. On SIGCONT the frozen one tries
    # two writes: the attempt's (a heartbeat, or its finish) and the notification's mark.
    # Both are rejected: two fenced writes, one lease lost.
    env = {
        "PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32",
        "PROMPTSCHED_NOTIFIER_LEASE": "3s",
        "PROMPTSCHED_NOTIFIER_TIMEOUT": "2500ms",
    }
    async with _held_hook() as hook:
        frozen = Service(dsn, tmp_path / "frozen.log", env=env)
        rescuer: Service | None = None
        try:
            await frozen.ready()
            now = await pool.fetchval("SELECT now()")
            slow = await factories.schedule(pool, params={"latency": "30s"})
            attempt_run = await factories.pending_run(pool, slow, now, "manual")

            async def held_by_frozen() -> bool:
                worker = await pool.fetchval(
                    "SELECT worker_id FROM runs WHERE id = $1", attempt_run
                )
                return str(worker).endswith(f":{frozen.pid}")

            await wait_until(held_by_frozen, timeout=15, what="the frozen process to claim")
            notified = await factories.schedule(pool)
            targets = notify_targets.validate_targets(
                {"webhook": {"url": hook.url}, "on_success": True},
                allow=netguard.Allowlist.parse(
                    "127.0.0.1/32", variable="PROMPTSCHED_WEBHOOK_ALLOW"
                ),
            )
            await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", notified, targets)
            await factories.pending_run(pool, notified, now, "manual")
            await asyncio.wait_for(hook.arrived.wait(), 15)  # its send is in flight
            before = await _scrape(frozen)
            frozen.signal(signal.SIGSTOP)

            rescuer = Service(dsn, tmp_path / "rescuer.log", env=env)

            async def taken_over() -> bool:
                run = await pool.fetchrow(
                    "SELECT attempts, worker_id FROM runs WHERE id = $1", attempt_run
                )
                sent = await pool.fetchval(
                    "SELECT count(*) FROM outbox WHERE schedule_id = $1 AND status = 'sent'",
                    notified,
                )
                assert rescuer is not None
                on_rescuer = str(run["worker_id"]).endswith(f":{rescuer.pid}")
                return run["attempts"] == 2 and on_rescuer and sent == 1

            await wait_until(taken_over, timeout=30, what="the rescuer to take both over")
            outbox_before = [dict(r) for r in await pool.fetch("SELECT * FROM outbox")]
            hook.release.set()
            frozen.signal(signal.SIGCONT)
            await frozen.wait_event("attempt.fenced", timeout=15, run_id=attempt_run)
            await frozen.wait_event("notification.fenced", timeout=15)
            after = await _scrape(frozen)
            outbox_after = [dict(r) for r in await pool.fetch("SELECT * FROM outbox")]
        finally:
            frozen.stop()
            if rescuer is not None:
                rescuer.stop()
    moved = _delta(before, after)
    attempt_kinds = {
        kind: value
        for (name, kind), value in moved.items()
        if name == "promptsched_fenced_writes_total" and kind in ("heartbeat", "finish")
    }
    # One write of the attempt was rejected (which one depends on which woke first), and the
    # notification's mark: 2 fenced writes against 1 lease lost (it expired while stopped).
    assert sum(attempt_kinds.values()) == 1, moved
    assert moved[("promptsched_fenced_writes_total", "outbox_mark")] == 1, moved
    fenced_total = sum(v for (name, _), v in moved.items() if name.startswith("promptsched_fenced"))
    lost_total = sum(v for (name, _), v in moved.items() if name.startswith("promptsched_leases"))
    assert (fenced_total, lost_total) == (2, 1), moved
    assert moved[("promptsched_leases_lost_total", "expired")] == 1, moved
    assert outbox_after == outbox_before, "the stale mark changed the outbox"
    assert hook.keys[0] == hook.keys[1], "the re-send was not the same message"
