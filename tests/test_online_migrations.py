"""Online migrations (store/migrate.py): each in its own transaction under a short
lock_timeout, backing off when a table it needs is busy, so that the fleet never queues
behind a migration that queues behind a reader; indexes built CONCURRENTLY and resumable;
``promptsched migrate --plan`` naming the locks each pending migration takes."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest

from promptsched.store import migrate
from promptsched.store import pool as pools
from promptsched.store.embedded import EmbeddedPostgres
from tests.helpers import Service, admin_execute, run_cli, wait_until

LEGACY = migrate.LEGACY_LAST  # the schema of the previous release (0.1.0)


async def _database_at(server: EmbeddedPostgres, name: str, version: int) -> str:
    """A new database migrated up to ``version`` by this runner."""
    await admin_execute(server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    await admin_execute(server, f"CREATE DATABASE {name}")
    dsn = server.dsn(name)
    conn = await pools.connect(dsn)
    try:
        await migrate.apply(conn, chain=migrate.all_migrations()[:version])
    finally:
        await conn.close()
    return dsn


@pytest.mark.slow
async def test_a_migration_behind_a_10s_reader_of_runs_never_stalls_the_schedules(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    """The migration the issue met (0020's shape: `schedules`, then `runs`) while a report
    reads `runs` for 10 s: the live replica's every-second schedule misses no slot and
    none is enqueued more than 2 s late; the replica stays ready on the newer schema."""
    token = run_cli("tokens", "create", "--owner", "ops", dsn=dsn).stdout.strip()
    service = Service(dsn, tmp_path / "service.log")
    try:
        await service.ready()
        port = (await service.wait_event("api.listening"))["port"]
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            every = {"name": "every-second", "cron": "* * * * * *", "prompt": "tick"}
            headers = {"Authorization": f"Bearer {token}"}
            async with http.post("/v1/schedules", json=every, headers=headers) as r:
                assert r.status == 201, await r.text()
                ticking = (await r.json())["id"]

            async def runs() -> int:
                n: int = await pool.fetchval(
                    "SELECT count(*) FROM runs WHERE schedule_id = $1", ticking
                )
                return n if n >= 2 else 0

            await wait_until(runs, timeout=10, what="the schedule to fire")
            latest = migrate.latest_version()
            extra = migrate.parse(
                latest + 1,
                "probe",
                "ALTER TABLE schedules ADD COLUMN probe_a text;\n"
                "ALTER TABLE runs ADD COLUMN probe_b text;\n",
            )
            unready: list[int] = []
            reading = anyio.Event()
            durations: dict[str, float] = {}

            async def reader() -> None:
                conn = await asyncpg.connect(dsn)
                try:
                    async with conn.transaction():
                        await conn.fetchval("SELECT count(*) FROM runs")
                        reading.set()
                        await anyio.sleep(10)
                finally:
                    await conn.close()

            async def migrator() -> None:
                await reading.wait()
                conn = await pools.connect(dsn)
                started = time.monotonic()
                try:
                    applied = await migrate.apply(conn, chain=[*migrate.all_migrations(), extra])
                finally:
                    await conn.close()
                durations["migrate"] = time.monotonic() - started
                assert applied == [latest + 1]

            async def readyz(stop: anyio.Event) -> None:
                while not stop.is_set():
                    async with http.get("/readyz") as r:
                        if r.status != 200:
                            unready.append(r.status)
                    await anyio.sleep(0.2)

            window_start = datetime.now().astimezone()
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(readyz, stop)
                async with anyio.create_task_group() as work:
                    work.start_soon(reader)
                    work.start_soon(migrator)
                await anyio.sleep(2)  # the schedule runs on under the new schema
                stop.set()
        rows = await pool.fetch(
            "SELECT slot, created_at FROM runs WHERE schedule_id = $1 AND origin = 'cadence' "
            "AND slot >= $2 ORDER BY slot",
            ticking,
            window_start,
        )
        slots = [row["slot"] for row in rows]
        gaps = [(b - a).total_seconds() for a, b in zip(slots, slots[1:], strict=False)]
        late = max((row["created_at"] - row["slot"]).total_seconds() for row in rows)
        print(f"migration took {durations['migrate']:.1f} s behind the reader; latest run "
              f"{late:.2f} s after its slot; {len(slots)} slots")  # fmt: skip
        assert durations["migrate"] >= 9  # it did wait for the reader, not around it
        assert set(gaps) == {1.0}, gaps  # no slot missed or doubled
        assert late <= 2.0
        assert unready == []
        assert service.has_event("migrate.lock_busy") is None  # the lines are the migrator's
    finally:
        assert service.stop() == 0


async def test_plan_lists_the_pending_migrations_and_their_locks(
    pg_server: EmbeddedPostgres,
) -> None:
    dsn = await _database_at(pg_server, "mig_plan", LEGACY)
    try:
        planned = run_cli("migrate", "--plan", dsn=dsn)
        assert planned.returncode == 0, planned.stderr
        lines = planned.stdout.splitlines()
        assert lines[0].startswith(f"{LEGACY + 1:04d}_")  # every pending one, in order
        guard = next(i for i, line in enumerate(lines) if "_schedule_names_guard " in line)
        assert lines[guard].endswith(f"(after it, releases from schema {LEGACY} on still run)")
        assert lines[guard + 1] == (
            "  step 1, in a transaction: ROW EXCLUSIVE on schedule_changes, ROW EXCLUSIVE on "
            "schedule_names, SHARE ROW EXCLUSIVE on schedules"
        )
        assert lines[guard + 2] == "    while it is held, writes to schedules wait (reads go on)"
        applied = run_cli("migrate", dsn=dsn)
        assert applied.returncode == 0, applied.stderr
        assert "_schedule_names_guard in " in applied.stdout
        assert applied.stdout.count("applied 00") == migrate.latest_version() - LEGACY
        again = run_cli("migrate", "--plan", dsn=dsn)
        assert again.stdout.strip() == "schema is up to date: nothing to apply"
        bad = run_cli("migrate", "--lock-timeout", "0", dsn=dsn)
        assert bad.returncode == 2 and "--lock-timeout" in bad.stderr
    finally:
        await admin_execute(pg_server, "DROP DATABASE IF EXISTS mig_plan WITH (FORCE)")


_MODES = {
    "ShareUpdateExclusiveLock": "SHARE UPDATE EXCLUSIVE",
    "ShareLock": "SHARE",
    "ShareRowExclusiveLock": "SHARE ROW EXCLUSIVE",
    "ExclusiveLock": "ACCESS EXCLUSIVE",  # no statement of ours takes it; stricter if one does
    "AccessExclusiveLock": "ACCESS EXCLUSIVE",
}
_STRENGTH = ("SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE", "ACCESS EXCLUSIVE")


async def test_the_plan_names_the_locks_each_migration_really_takes(
    pg_server: EmbeddedPostgres,
) -> None:
    """Every transactional step of every migration run on a fresh database, its locks read
    from pg_locks before it commits: the plan names, for each table that existed before,
    the strongest lock that blocks the fleet (SHARE UPDATE EXCLUSIVE and up)."""
    await admin_execute(pg_server, "DROP DATABASE IF EXISTS mig_locks WITH (FORCE)")
    await admin_execute(pg_server, "CREATE DATABASE mig_locks")
    conn = await pools.connect(pg_server.dsn("mig_locks"))
    wrong = []
    try:
        for migration in migrate.all_migrations():
            for step in migration.steps:
                if step.mode != "transaction":
                    for statement in step.statements():
                        await conn.execute(statement)
                    continue
                indexes = await migrate.index_tables(conn)
                async with conn.transaction():
                    before = {r["oid"] for r in await conn.fetch(
                        "SELECT oid FROM pg_class WHERE relkind IN ('r', 'p')")}  # fmt: skip
                    await conn.execute(step.sql)
                    held = await conn.fetch(
                        "SELECT c.oid, c.relname, l.mode FROM pg_locks l "
                        "JOIN pg_class c ON c.oid = l.relation "
                        "WHERE l.pid = pg_backend_pid() AND c.relkind IN ('r', 'p') "
                        "AND c.relnamespace = 'public'::regnamespace"
                    )
                    tables = {r["relname"] for r in await conn.fetch(
                        "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p')")}  # fmt: skip
                real: dict[str, str] = {}
                for row in held:
                    mode = _MODES.get(row["mode"])
                    if mode is None or row["oid"] not in before:
                        continue
                    old = real.get(row["relname"])
                    if old is None or _STRENGTH.index(mode) > _STRENGTH.index(old):
                        real[row["relname"]] = mode
                said = {  # a table renamed by the step is checked under its new name
                    t: lock
                    for t, lock in migrate.locks_of(step, indexes).items()
                    if lock in _STRENGTH and t in tables
                }
                if said != real:
                    wrong.append((migration.label, said, real))
    finally:
        await conn.close()
        await admin_execute(pg_server, "DROP DATABASE IF EXISTS mig_locks WITH (FORCE)")
    assert wrong == [], "\n".join(map(str, wrong))


async def test_duplicate_names_are_put_right_and_refused_by_the_database_itself(
    pg_server: EmbeddedPostgres,
) -> None:
    """A database of the previous release where an older release made a second `echo-1`
    (no row in schedule_names): the migration renames the later one, saying so in its
    history, and from then on the database refuses a second name whatever writes it."""
    dsn = await _database_at(pg_server, "mig_dupes", LEGACY)
    conn = await pools.connect(dsn)
    try:
        insert = (
            "INSERT INTO schedules (owner, name, kind, expression, prompt) "
            "VALUES ('alice', $1, 'cron', '* * * * *', 'p') RETURNING id"
        )
        first = await conn.fetchval(insert, "echo-1")
        await conn.execute(
            "INSERT INTO schedule_names (owner, name, schedule_id) VALUES ('alice', 'echo-1', $1)",
            first,
        )
        second = await conn.fetchval(insert, "echo-1")  # as a release without schedule_names
        assert await migrate.apply(conn) == list(range(LEGACY + 1, migrate.latest_version() + 1))
        names = dict(await conn.fetch("SELECT id, name FROM schedules ORDER BY id"))
        assert names == {first: "echo-1", second: f"echo-1 #{second}"}
        registered = await conn.fetch("SELECT name, schedule_id FROM schedule_names ORDER BY 2")
        assert [tuple(r) for r in registered] == [("echo-1", first), (f"echo-1 #{second}", second)]
        history = await conn.fetchval(
            "SELECT changes FROM schedule_changes WHERE schedule_id = $1 AND actor = 'promptsched'",
            second,
        )
        assert history == {"name": ["echo-1", f"echo-1 #{second}"]}
        # Written as a release that knows nothing of schedule_names writes: refused.
        with pytest.raises(asyncpg.UniqueViolationError, match="already named 'echo-1'"):
            await conn.fetchval(insert, "echo-1")
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute("UPDATE schedules SET name = 'echo-1' WHERE id = $1", second)
        # A new name, or a rename to a free one, is registered for the next claim.
        third = await conn.fetchval(insert, "echo-3")
        await conn.execute("UPDATE schedules SET name = 'echo-4' WHERE id = $1", third)
        holder = await conn.fetchval(
            "SELECT schedule_id FROM schedule_names WHERE owner = 'alice' AND name = 'echo-4'"
        )
        assert holder == third
        assert (
            await conn.fetchval("SELECT count(*) FROM schedule_names WHERE schedule_id = $1", third)
            == 1
        )
    finally:
        await conn.close()
        await admin_execute(pg_server, "DROP DATABASE IF EXISTS mig_dupes WITH (FORCE)")


async def test_an_index_build_left_invalid_is_dropped_and_built_again(dsn: str) -> None:
    """An index built CONCURRENTLY (outside a transaction) whose earlier build was
    interrupted: the INVALID index it left is dropped and the index built, valid."""
    conn = await pools.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO schedules (owner, name, kind, expression, prompt) "
            "VALUES ('a', 'x', 'cron', '* * * * *', 'p'), ('b', 'x', 'cron', '* * * * *', 'p')"
        )
        with pytest.raises(asyncpg.UniqueViolationError):  # an interrupted build, as it leaves
            await conn.execute("CREATE UNIQUE INDEX CONCURRENTLY probe_idx ON schedules (name)")
        valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = 'probe_idx'::regclass"
        assert await conn.fetchval(valid) is False
        extra = migrate.parse(
            migrate.latest_version() + 1,
            "probe",
            "-- promptsched: step no-transaction\n"
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS probe_idx ON schedules (name);\n",
        )
        assert await migrate.apply(conn, chain=[*migrate.all_migrations(), extra]) == [
            extra.version
        ]
        assert await conn.fetchval(valid) is True
        assert (
            await conn.fetchval(
                "SELECT indisunique FROM pg_index WHERE indexrelid = 'probe_idx'::regclass"
            )
            is False
        )  # the file's index, not the leftover
    finally:
        await conn.close()
