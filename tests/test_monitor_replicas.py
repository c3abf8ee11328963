"""Monitors under replicas (docs/monitors.md): two real `promptsched run` processes take a rush
of 1,000 `changed` watchers, each with three runs in flight at once (three missed slots run
together), finished by either replica in whatever order. Each run's notification decision is
made once, in the transaction that finishes it: every success has one, each watcher notifies
exactly once (its first output; the same answer after it is "unchanged since" that run), and
exactly one message is owed per watcher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.helpers import Service, wait_until

WATCHERS = 1_000
GROUP = 8  # watchers whose slots come due together: their 24 runs are in flight at once


@pytest.mark.slow
async def test_each_decision_is_made_once_under_two_replicas(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    # Three past slots each (one-shot RRULEs, a group of watchers starting every 3 s) and
    # misfire run_all with overlap allow: the scheduler writes all three runs at once, and
    # claims in slot order keep a watcher's runs within one group's 24.
    await pool.execute(
        "INSERT INTO schedules (name, kind, expression, prompt, params, next_fire_at, "
        "misfire_policy, overlap_policy, notify_when, notify) "
        "SELECT 'watch-' || g, 'rrule', 'DTSTART:' || to_char(t, 'YYYYMMDD\"T\"HH24MISS\"Z\"') "
        "|| E'\\nRRULE:FREQ=SECONDLY;COUNT=3', 'All good on page ' || g, "
        "'{\"latency\": \"100ms\"}', t, 'run_all', 'allow', 'changed', "
        '\'{"email": ["ops@example.com"]}\' '
        "FROM generate_series(1, $1) g, "
        "LATERAL (SELECT timestamptz '2026-01-01 00:00:00+00' "
        "+ (g / $2) * interval '3 seconds' AS t) s",
        WATCHERS,
        GROUP,
    )
    env = {"PROMPTSCHED_WORKERS": "16"}
    replicas = [Service(dsn, tmp_path / f"replica-{i}.log", env=env) for i in range(2)]
    try:
        for replica in replicas:
            await replica.ready()

        async def all_finished() -> bool:
            done = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'")
            return bool(done == 3 * WATCHERS)

        await wait_until(all_finished, timeout=90, what="3,000 runs of the rush to succeed")
    finally:
        for replica in replicas:
            assert replica.stop() == 0
    rows = await pool.fetch(
        "SELECT id, schedule_id, worker_id, notify_decision FROM runs ORDER BY schedule_id, id"
    )
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE status <> 'succeeded'") == 0
    by_watcher: dict[int, list[asyncpg.Record]] = {}
    for row in rows:
        by_watcher.setdefault(row["schedule_id"], []).append(row)
    assert len(by_watcher) == WATCHERS
    # The race is real: many watchers had their runs finished by both replicas.
    split = sum(1 for runs in by_watcher.values() if len({r["worker_id"] for r in runs}) > 1)
    assert split >= 100, split
    for watcher, runs in by_watcher.items():
        decisions = [r["notify_decision"] for r in runs]
        assert all(d is not None for d in decisions), (watcher, decisions)  # none lost
        told = [r["id"] for r, d in zip(runs, decisions, strict=True) if d["notify"]]
        assert len(told) == 1, (watcher, decisions)  # no double "changed"
        [first] = told
        quiet = sorted(d["reason"] for d in decisions if not d["notify"])
        assert quiet == [f"output unchanged since run {first}"] * 2, (watcher, decisions)
    owed = await pool.fetch(
        "SELECT schedule_id, count(*) AS n FROM outbox WHERE event = 'succeeded' "
        "GROUP BY schedule_id"
    )
    assert len(owed) == WATCHERS and {r["n"] for r in owed} == {1}
