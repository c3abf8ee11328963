"""1,000 follow-ups against two real `promptsched run` replicas: placed by key over HTTP (a
re-created key is the same follow-up), half cancelled by key before their time (no run for
them, ever), the rest fired once each, all due at the same instant, while one replica is
SIGKILLed mid-rush and restarted: nothing is lost and nothing is doubled."""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg

from promptsched.web import auth
from tests.helpers import Service, wait_until

COUNT = 1000
PARALLEL = 16


async def _replica(dsn: str, tmp_path: Path, name: str) -> tuple[Service, str]:
    # A thousand follow-ups as fast as one token can ask: past the API's rate per token
    # (PROMPTSCHED_API_RATE, tests/test_quotas.py), which this test is not about.
    service = Service(
        dsn, tmp_path / f"{name}.log", args=("--workers", "16"), env={"PROMPTSCHED_API_RATE": "0"}
    )
    port = (await service.wait_event("api.listening", timeout=60))["port"]
    await service.ready()
    return service, f"http://127.0.0.1:{port}"


async def _each(items: list[Any], work: Any) -> None:
    """``work(item)`` for every item, PARALLEL at a time."""
    limiter = anyio.Semaphore(PARALLEL)

    async def one(item: Any) -> None:
        async with limiter:
            await work(item)

    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(one, item)


async def test_a_thousand_keyed_followups_survive_a_sigkill(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    token, _ = await auth.create_token(pool, owner="shop")
    who = {"Authorization": f"Bearer {token}"}
    a, url = await _replica(dsn, tmp_path, "a")
    b, _ = await _replica(dsn, tmp_path, "b")
    due = await pool.fetchval("SELECT date_trunc('second', now()) + interval '20 seconds'")
    keys = [f"order-{n}" for n in range(COUNT)]

    def body(key: str) -> dict[str, Any]:
        return {"key": key, "at": due.isoformat(), "prompt": "Has {{ order }} shipped?",
                "vars": {"order": key}, "params": {"latency": "300ms"}}  # fmt: skip

    try:
        async with aiohttp.ClientSession(headers=who) as http:
            statuses: dict[str, list[int]] = {key: [] for key in keys}
            schedules: dict[str, list[int]] = {key: [] for key in keys}

            async def create(key: str) -> None:
                async with http.post(f"{url}/v1/followups", json=body(key)) as reply:
                    statuses[key].append(reply.status)
                    schedules[key].append((await reply.json())["schedule_id"])

            await _each(keys, create)
            # Re-created keys are the same follow-ups (200), whoever asks twice.
            await _each(keys[::10], create)
            # Half are cancelled by key before their time, a few of them twice.
            cancelled = keys[::2]

            async def cancel(key: str) -> None:
                async with http.delete(f"{url}/v1/followups/{key}") as reply:
                    statuses[key].append(reply.status)

            await _each(cancelled + cancelled[:20], cancel)
        now = await pool.fetchval("SELECT now()")
        assert now < due - timedelta(seconds=1), "placing and cancelling took too long"
        assert all(s[0] == 201 for s in statuses.values())
        assert all(s[1] == 200 for k, s in statuses.items() if k in keys[::10])
        # ... the same schedule back, not a second one.
        assert all(len(ids) == 2 and ids[0] == ids[1] for k, ids in schedules.items()
                   if k in keys[::10])  # fmt: skip
        assert len({ids[0] for ids in schedules.values()}) == COUNT
        assert {tuple(s[-1:]) for k, s in statuses.items() if k in cancelled} == {(204,)}

        holder = (await b.ready())["worker_id"]

        async def b_holds_checks_mid_rush() -> bool:
            # Each replica's slots run their 300 ms checks in step, so the moment a count of
            # done checks is crossed is often a batch's end: ask for checks b holds right now.
            done, held = await pool.fetchrow(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                "count(*) FILTER (WHERE status = 'running' AND worker_id = $1) FROM runs",
                holder,
            )
            return bool(done >= 100 and held > 0)

        await wait_until(b_holds_checks_mid_rush, timeout=60, what="b to hold checks mid-rush")
        b.signal(signal.SIGKILL)  # mid-rush: its running checks are reaped and run again
        b.stop()
        b, _ = await _replica(dsn, tmp_path, "b2")

        async def all_done() -> bool:
            active = await pool.fetchval("SELECT count(*) FROM followups WHERE state = 'active'")
            return active == 0

        await wait_until(all_done, timeout=90, what="every live follow-up to be checked")
    finally:
        a.stop()
        b.stop()
    rows = await pool.fetch(
        "SELECT f.key, f.state, f.checks, count(r.id) AS runs, "
        "count(r.id) FILTER (WHERE r.status = 'succeeded') AS ok, "
        "(SELECT count(*) FROM followup_checks c WHERE c.schedule_id = f.schedule_id) AS ledger "
        "FROM followups f LEFT JOIN runs r ON r.schedule_id = f.schedule_id GROUP BY f.schedule_id"
    )
    assert len(rows) == COUNT
    gone = {r["key"] for r in rows if r["state"] == "cancelled"}
    assert gone == set(cancelled)
    for row in rows:
        if row["key"] in gone:  # no run for them, ever
            assert (row["runs"], row["ledger"]) == (0, 0), dict(row)
        else:  # exactly one run each, succeeded, one check recorded: done
            assert (row["state"], row["checks"], row["runs"], row["ok"], row["ledger"]) == (
                "done",
                1,
                1,
                1,
                1,
            ), dict(row)
    # The kill happened mid-rush: some checks needed a second attempt, none a second run.
    retried = await pool.fetchval("SELECT count(*) FROM runs WHERE attempts > 1")
    killed = await pool.fetchval("SELECT count(*) FROM run_attempts WHERE status = 'lost'")
    assert retried == killed and killed > 0
