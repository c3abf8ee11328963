"""The store: migrations, the schema snapshot, the query registry, and index-backed plans."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched.errors import SchemaMismatch
from promptsched.store import migrate, queries, sqlfiles
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres, _bin

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "promptsched" / "store" / "sql" / "schema.sql"


def test_every_named_query_has_exactly_one_wrapper() -> None:
    source = (ROOT / "promptsched" / "store" / "queries.py").read_text()
    used = re.findall(r'_Q\["([a-z_]+)"\]', source)
    names = set(sqlfiles.queries())
    assert sorted(used) == sorted(set(used)), "a query is wrapped twice"
    assert set(used) == names
    for name in names:
        assert re.search(rf"^async def {name}\(", source, re.MULTILINE), f"{name} wrapper name"


def test_no_sql_outside_the_store() -> None:
    offenders = []
    for path in (ROOT / "promptsched").rglob("*.py"):
        if "store" in path.parts:
            continue
        text = path.read_text()
        if re.search(r"\b(UPDATE \w+ SET|INSERT INTO|DELETE FROM)\b", text):
            offenders.append(str(path))
    assert offenders == []


async def test_migrations_are_idempotent_and_concurrent_safe(pg_server: EmbeddedPostgres) -> None:
    admin = await asyncpg.connect(pg_server.dsn())
    await admin.execute("DROP DATABASE IF EXISTS mig_race WITH (FORCE)")
    await admin.execute("CREATE DATABASE mig_race")
    try:
        conns = [await pools.connect(pg_server.dsn("mig_race")) for _ in range(3)]
        results: list[list[int]] = []

        async def apply(conn: Any) -> None:
            results.append(await migrate.apply(conn))

        async with anyio.create_task_group() as tg:
            for conn in conns:
                tg.start_soon(apply, conn)
        # Each migration was applied by exactly one replica; the others found it applied.
        latest = migrate.latest_version()
        applied = sorted(v for r in results for v in r)
        assert applied == list(range(1, latest + 1))
        assert await migrate.apply(conns[0]) == []
        await migrate.check(conns[0])
        for conn in conns:
            await conn.close()
    finally:
        await admin.execute("DROP DATABASE IF EXISTS mig_race WITH (FORCE)")
        await admin.close()


async def _future(conn: Any, version: int, compat: int) -> None:
    await conn.execute(
        "INSERT INTO promptsched_schema (version, name, steps, steps_done, compat, release) "
        "VALUES ($1, 'future', 1, 1, $2, '9.9.9')",
        version, compat,
    )  # fmt: skip


async def test_check_refuses_a_schema_behind_or_beyond_its_window(
    pool: asyncpg.Pool[Any],
) -> None:
    async with pool.acquire() as conn:
        await migrate.check(conn)
        latest = migrate.latest_version()
        # A newer release's additive migration: this one still runs on it.
        await _future(conn, latest + 1, migrate.compat_of(migrate.all_migrations())[latest])
        await migrate.check(conn)
        assert await migrate.apply(conn) == []
        # One that leaves this release behind: it refuses, in one line naming the fix.
        await _future(conn, latest + 2, latest + 1)
        with pytest.raises(SchemaMismatch, match="deploy a newer release") as refused:
            await migrate.check(conn)
        assert "\n" not in str(refused.value)
        with pytest.raises(SchemaMismatch, match="deploy a newer release"):
            await migrate.apply(conn)
        await conn.execute("DELETE FROM promptsched_schema WHERE version >= $1", latest)
        with pytest.raises(SchemaMismatch, match="promptsched migrate"):
            await migrate.check(conn)


def _dump_schema(dsn: str) -> str:
    out = subprocess.run(
        [_bin("pg_dump"), "--schema-only", "--no-owner", "--no-privileges", dsn],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [
        line
        for line in out.splitlines()
        if line.strip()
        and not line.startswith(("--", "SET ", "SELECT pg_catalog.set_config"))
        and not line.startswith("\\")
    ]
    return "\n".join(lines) + "\n"


def test_schema_snapshot_matches_migrations(dsn: str) -> None:
    """Regenerate with ``UPDATE_SNAPSHOT=1 make test`` after adding a migration."""
    dumped = _dump_schema(dsn)
    if os.environ.get("UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text(dumped)
    assert SNAPSHOT.read_text() == dumped, "schema.sql is stale: run UPDATE_SNAPSHOT=1 make test"


async def _plan(conn: Any, sql: str, *args: Any) -> str:
    rows = await conn.fetch(f"EXPLAIN (FORMAT TEXT) {sql}", *args)
    return "\n".join(row[0] for row in rows)


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed", "stale-stats"])
async def test_claim_and_due_queries_use_their_indexes(
    pool: asyncpg.Pool[Any], analyzed: bool
) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO schedules (name, kind, expression, prompt, next_fire_at) "
            "SELECT 's' || g, 'cron', '* * * * *', 'p', now() + g * interval '1 second' "
            "FROM generate_series(1, 5000) g"
        )
        await conn.execute(
            "INSERT INTO runs (schedule_id, slot, provider, max_attempts, status, finished_at) "
            "SELECT 1 + g % 5000, now() - g * interval '1 second', 'echo', 3, "
            "CASE WHEN g % 10 = 0 THEN 'pending' ELSE 'succeeded' END, "
            "CASE WHEN g % 10 = 0 THEN NULL ELSE now() END FROM generate_series(1, 50000) g"
        )
        if analyzed:
            await conn.execute("ANALYZE")
        claim = sqlfiles.queries()["run_claim_batch"]
        plan = await _plan(conn, claim, None, "echo", 10, "w", timedelta(seconds=30))
        assert "runs_claim_idx" in plan, plan
        assert "Sort" not in plan and "Seq Scan on runs" not in plan, plan
        # As the scheduler runs it: after schedule_plan_fresh, in the batch's transaction.
        tx = conn.transaction()
        await tx.start()
        await conn.execute(sqlfiles.queries()["schedule_plan_fresh"])
        due = sqlfiles.queries()["schedule_take_due"]
        plan = await _plan(conn, due, None, 500, 0)
        await tx.rollback()
        assert "schedules_due_idx" in plan, plan
        assert "Seq Scan on schedules" not in plan, plan
        # The scheduler's sleep reads the earliest cursor from the same partial index.
        plan = await _plan(conn, sqlfiles.queries()["schedule_seconds_until_due"], None)
        assert "schedules_due_idx" in plan, plan


async def _schedule_with_runs(conn: Any, count: int, *, origin: str, status: str) -> int:
    """One schedule with ``count`` runs a second apart, all in ``status`` (finished unless
    pending)."""
    sid: int = await conn.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt) "
        "VALUES ('s', 'cron', '* * * * *', 'p') RETURNING id"
    )
    await conn.execute(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, status, "
        "finished_at) SELECT $1, now() - g * interval '1 second', $3, 'echo', 3, $4, "
        "CASE WHEN $4 = 'pending' THEN NULL ELSE now() END FROM generate_series(1, $2) g",
        sid,
        count,
        origin,
        status,
    )
    return sid


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed", "stale-stats"])
async def test_a_large_claim_updates_its_runs_by_primary_key(
    pool: asyncpg.Pool[Any], analyzed: bool
) -> None:
    # A claim of 64 from a backlog of 5,000: joined to the locked candidates, the update read
    # the whole runs table into a hash once per claim (a cost that grew with the table).
    async with pool.acquire() as conn:
        await _schedule_with_runs(conn, 5000, origin="manual", status="pending")
        if analyzed:
            await conn.execute("ANALYZE")
        claim = sqlfiles.queries()["run_claim_batch"]
        plan = await _plan(conn, claim, None, "echo", 64, "w", timedelta(seconds=30))
        assert (
            "Index Scan using runs_pkey on runs" in plan or "Bitmap Index Scan on runs_pkey" in plan
        ), plan
        assert "Seq Scan on runs r" not in plan, plan


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed", "stale-stats"])
async def test_deleting_a_run_finds_its_replays_through_an_index(
    pool: asyncpg.Pool[Any], analyzed: bool
) -> None:
    # ON DELETE SET NULL on runs.replay_of runs this lookup once per deleted run (retention
    # purges thousands): without an index of its own it read the whole table each time.
    async with pool.acquire() as conn:
        await _schedule_with_runs(conn, 50000, origin="cadence", status="dead")
        await conn.execute(
            "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, replay_of) "
            "SELECT schedule_id, slot, 'replay', provider, max_attempts, id FROM runs "
            "ORDER BY id LIMIT 100"
        )
        if analyzed:
            await conn.execute("ANALYZE")
        plan = await _plan(conn, "UPDATE ONLY runs SET replay_of = NULL WHERE $1 = replay_of", 7)
        assert "runs_replay_of_idx" in plan, plan
        assert "Seq Scan" not in plan, plan
        replay = await conn.fetchval("SELECT id FROM runs WHERE replay_of = 1")
        await conn.execute("DELETE FROM runs WHERE id = 1")
        assert await conn.fetchval("SELECT replay_of FROM runs WHERE id = $1", replay) is None


async def test_wrappers_round_trip_one_run(pool: asyncpg.Pool[Any]) -> None:
    sid = await pool.fetchval(
        "INSERT INTO schedules (name, kind, expression, prompt) "
        "VALUES ('x', 'cron', '* * * * *', 'p') RETURNING id"
    )
    await pool.execute(
        "INSERT INTO runs (schedule_id, slot, provider, max_attempts) "
        "VALUES ($1, now(), 'echo', 3)",
        sid,
    )
    from datetime import timedelta

    claimed = await queries.run_claim_batch(pool, None, "echo", 5, "w1", timedelta(seconds=30))
    assert [row.attempts for row in claimed] == [1]
    assert claimed[0].prompt == "p"


async def test_a_new_pooled_connection_needs_no_type_lookup_for_any_query(dsn: str) -> None:
    # asyncpg looks a type up on first use, a catalog query per connection; the pool resolves
    # every array type at connect time so no claim, finish or tick of a rush waits on one.
    # Preparing a statement runs no query of its own: anything logged is a type lookup.
    fresh = await pools.create_pool(dsn, min_size=1, max_size=1)
    looked_up: dict[str, int] = {}
    current = ""

    def log(_logged: Any) -> None:
        looked_up[current] = looked_up.get(current, 0) + 1

    try:
        async with fresh.acquire() as conn:
            conn.add_query_logger(log)
            for current, sql in sorted(sqlfiles.queries().items()):  # noqa: B007
                await conn.prepare(sql)
            conn.remove_query_logger(log)
    finally:
        await fresh.close()
    assert looked_up == {}, "add the array types these queries use to pool._ARRAY_TYPES"
