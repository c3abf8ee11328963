"""Invariant 5 written once: the finish and the reap owe notifications through the one SQL
function outbox_owe (0007_outbox_owe.sql), and owe exactly the rows they owed before."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from typing import Any

import asyncpg

from promptsched.domain import RunStatus
from promptsched.store import queries, sqlfiles
from tests import factories

T0 = factories.EPOCH
HOOK = {"url": "https://hooks.example/x", "headers": {"X-A": "1"}}
SECRET_HOOK = {**HOOK, "secret": "s3cret"}


def test_both_statements_owe_through_the_one_function() -> None:
    registry = sqlfiles.queries()
    for name in ("run_finish_many", "run_reap_expired"):
        sql = registry[name]
        assert len(re.findall(r"\boutbox_owe\(", sql)) == 1, name
        assert "INSERT INTO outbox" not in sql, name
        assert "notify_channels" not in sql.split("outbox_owe(")[1], name
    owners = [name for name, sql in registry.items() if re.search(r"\boutbox_owe\(", sql)]
    assert sorted(owners) == ["run_finish_many", "run_reap_expired"]


async def _schedule(pool: asyncpg.Pool[Any], notify: dict[str, Any] | None) -> int:
    sid = await factories.schedule(pool, max_attempts=1)
    await pool.execute("UPDATE schedules SET notify = $2::jsonb WHERE id = $1", sid, notify or {})
    return sid


async def _running(pool: asyncpg.Pool[Any], sid: int, lease_left: timedelta) -> tuple[int, Any]:
    rid = await factories.pending_run(pool, sid, origin="manual")
    attempt = uuid.uuid4()
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt_id = $2, attempts = 1, worker_id = 'w',"
        " lease_expires_at = $3::timestamptz, deadline_at = $3::timestamptz + interval '1 hour',"
        " attempt_started_at = $3::timestamptz - interval '1 minute'"
        " WHERE id = $1",
        rid,
        attempt,
        T0 + lease_left,
    )
    return rid, attempt


def _expected(rid: int, sid: int, event: str, targets: dict[str, Any]) -> set[tuple[Any, ...]]:
    return {
        (rid, sid, channel, json.dumps(target, sort_keys=True), event,
         f"promptsched-{rid}-{event}-{channel}", T0, RunStatus.PENDING.value)
        for channel, target in targets.items()
    }  # fmt: skip


async def _outbox(pool: asyncpg.Pool[Any]) -> set[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT run_id, schedule_id, channel, target::text, event, idempotency_key,"
        " available_at, status FROM outbox"
    )
    return {(*r[:3], json.dumps(json.loads(r["target"]), sort_keys=True), *r[4:]) for r in rows}


async def test_a_finish_and_a_reap_owe_each_target_that_asked_for_the_event(
    pool: asyncpg.Pool[Any],
) -> None:
    both = await _schedule(pool, {"email": ["a@example.com"], "webhook": SECRET_HOOK})
    success_only = await _schedule(
        pool, {"email": ["b@example.com"], "webhook": HOOK, "on_failure": False}
    )
    failure_only = await _schedule(pool, {"webhook": HOOK, "on_success": False})
    silent = await _schedule(pool, None)
    far, gone = timedelta(minutes=10), timedelta(seconds=-1)
    finishes = {
        (both, RunStatus.SUCCEEDED): await _running(pool, both, far),
        (success_only, RunStatus.SUCCEEDED): await _running(pool, success_only, far),
        (success_only, RunStatus.DEAD): await _running(pool, success_only, far),
        (failure_only, RunStatus.SUCCEEDED): await _running(pool, failure_only, far),
        (failure_only, RunStatus.DEAD): await _running(pool, failure_only, far),
        (silent, RunStatus.DEAD): await _running(pool, silent, far),
        (both, RunStatus.CANCELLED): await _running(pool, both, far),
    }
    reaped_both, _ = await _running(pool, both, gone)  # attempts used up: dead
    reaped_success_only, _ = await _running(pool, success_only, gone)

    landed = await queries.run_finish_many(
        pool,
        T0,
        [
            queries.Finish(
                run_id=rid,
                attempt_id=attempt,
                status=status,
                attempt_status="succeeded" if status is RunStatus.SUCCEEDED else "failed",
                output="out" if status is RunStatus.SUCCEEDED else None,
                usage=None,
                error=None if status is RunStatus.SUCCEEDED else "e",
                retry_in=None,
                skip_reason=None,
            )
            for (_, status), (rid, attempt) in finishes.items()
        ],
        "w",
    )
    assert landed == {rid for rid, _ in finishes.values()}
    reaped = await queries.run_reap_expired(pool, T0, 10, timedelta(minutes=1))
    assert {(r.id, r.status) for r in reaped} == {
        (reaped_both, RunStatus.DEAD),
        (reaped_success_only, RunStatus.DEAD),
    }
    assert all(r.woken == 1 for r in reaped)

    public_hook = HOOK  # the secret never reaches the outbox
    email_a, email_b = ["a@example.com"], ["b@example.com"]
    expected = (
        _expected(finishes[both, RunStatus.SUCCEEDED][0], both, "succeeded",
                  {"email": email_a, "webhook": public_hook})
        | _expected(finishes[success_only, RunStatus.SUCCEEDED][0], success_only, "succeeded",
                    {"email": email_b, "webhook": HOOK})
        | _expected(finishes[failure_only, RunStatus.DEAD][0], failure_only, "dead",
                    {"webhook": HOOK})
        | _expected(reaped_both, both, "dead", {"email": email_a, "webhook": public_hook})
    )  # fmt: skip
    assert await _outbox(pool) == expected


async def test_owing_the_same_event_again_writes_nothing(pool: asyncpg.Pool[Any]) -> None:
    sid = await _schedule(pool, {"email": ["a@example.com"], "webhook": HOOK})
    rid, _ = await _running(pool, sid, timedelta(seconds=-1))
    assert [r.status for r in await queries.run_reap_expired(pool, T0, 10, timedelta())] == [
        RunStatus.DEAD
    ]
    written = await pool.fetchval(
        "SELECT outbox_owe(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY['dead'], $3)", rid, sid, T0
    )
    assert written == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE run_id = $1", rid) == 2
