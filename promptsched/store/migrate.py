"""Forward-only, online schema migrations (docs/deploying.md, "Upgrading").

Each migration runs in a transaction of its own under a short ``lock_timeout``: one that
cannot take its locks at once (a long report holds `runs`) gives them all back and tries
again after a backoff, so the fleet never queues behind a migration that queues behind a
reader. A file may be split into steps by header comments::

    -- promptsched: step                    a transaction of its own (the default first step)
    -- promptsched: step no-transaction     each statement alone (CREATE INDEX CONCURRENTLY)
    -- promptsched: step batch              one bounded statement, repeated until it changes
                                            no row, each time in a transaction of its own

A step that runs outside a transaction must be safe to run again: an index it builds
CONCURRENTLY that an interrupted build left INVALID is dropped and built again. Progress is
recorded per step, so an interrupted migration resumes at the step it was in.

Compatibility: every migration records the oldest schema version whose code still runs on
the schema after it (``-- promptsched: compat N``; a plain additive file keeps the previous
one). A release whose own schema version is at least that starts and serves on a newer
schema; an older one refuses with one line. Releases before this scheme (0.1.0, schema 34)
read only ``promptsched_migrations``: it keeps their rows and gets a newer one only when a
migration leaves them behind, so that they refuse exactly then.
"""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
import structlog

from promptsched import __version__
from promptsched.errors import SchemaMismatch
from promptsched.store.pool import Conn
from promptsched.store.sqlfiles import migrations

log = structlog.get_logger("migrate")

# Any constant shared by every replica; two replicas migrating at once serialize on it.
_LOCK_KEY = 0x7072_6F6D_7074
_STEP_LOCK_KEY = _LOCK_KEY + 1  # held by the one migrator running a step outside a transaction
# The last schema version of releases that read only promptsched_migrations (0.1.0).
LEGACY_LAST = 34
LOCK_TIMEOUT = 1.0  # seconds a statement of a migration waits for a lock before it backs off
PATIENCE = 600.0  # seconds of retries before a migration that cannot take its locks gives up

_LEGACY_TABLE = """
CREATE TABLE IF NOT EXISTS promptsched_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
# One row per migration this scheme applied or found applied: how many of its steps are done
# (complete when steps_done = steps), and the oldest schema version that runs after it. The
# rows of the runner before it are adopted as they are, each its own compat (those releases
# refused any newer schema).
_TABLE = """
CREATE TABLE IF NOT EXISTS promptsched_schema (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    steps      integer NOT NULL,
    steps_done integer NOT NULL,
    compat     integer NOT NULL,
    release    text NOT NULL,
    applied_at timestamptz
)"""
_ADOPT = """
INSERT INTO promptsched_schema (version, name, steps, steps_done, compat, release, applied_at)
SELECT version, name, 1, 1, version, 'before 0.2.0', applied_at FROM promptsched_migrations
ON CONFLICT (version) DO NOTHING"""

_DIRECTIVE = re.compile(r"^--\s*promptsched:\s*(.+?)\s*$", re.MULTILINE)
_INDEX_NAME = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I
)


@dataclass(frozen=True)
class Step:
    sql: str
    mode: str = "transaction"  # or "no-transaction", "batch"

    def statements(self) -> list[str]:
        """The statements of a no-transaction step, one by one (no function bodies there)."""
        parts = [_strip_comments(part).strip() for part in self.sql.split(";")]
        return [part for part in parts if part]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    steps: tuple[Step, ...]
    compat: int | None = None  # declared: code of schema versions below it no longer runs

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass
class Options:
    lock_timeout: float = LOCK_TIMEOUT
    patience: float = PATIENCE
    say: Callable[[str], None] = field(default=lambda line: None)


def parse(version: int, name: str, sql: str) -> Migration:
    """A migration file: its steps and its declared compatibility (see the module's text)."""
    compat: int | None = None
    steps: list[Step] = []
    mode = "transaction"
    start = 0
    for match in _DIRECTIVE.finditer(sql):
        words = match.group(1).split()
        if words[0] == "compat" and len(words) == 2 and words[1].isdigit():
            compat = int(words[1])
            continue
        if words[0] == "step" and len(words) <= 2:
            kind = words[1] if len(words) == 2 else "transaction"
            if kind not in ("transaction", "no-transaction", "batch"):
                raise ValueError(f"migration {version}: unknown step kind {kind!r}")
            if _strip_comments(sql[start : match.start()]).strip():
                steps.append(Step(sql[start : match.start()], mode))
            mode, start = kind, match.end()
            continue
        raise ValueError(f"migration {version}: unknown directive {match.group(0)!r}")
    if _strip_comments(sql[start:]).strip() or not steps:
        steps.append(Step(sql[start:], mode))
    return Migration(version, name, tuple(steps), compat)


def all_migrations() -> list[Migration]:
    return [parse(version, name, sql) for version, name, sql in migrations()]


def latest_version() -> int:
    return migrations()[-1][0]


def compat_of(chain: Sequence[Migration]) -> dict[int, int]:
    """Each migration's compatibility: declared, else the previous one's (an additive file);
    up to 0.1.0 each was its own version (those releases refused any newer schema)."""
    result: dict[int, int] = {}
    previous = 0
    for migration in chain:
        if migration.compat is not None:
            previous = max(previous, migration.compat)
        elif migration.version <= LEGACY_LAST:
            previous = migration.version
        result[migration.version] = previous
    return result


@dataclass(frozen=True)
class State:
    version: int  # the last migration applied completely
    compat: int  # the oldest schema version whose code still runs on it


async def state(conn: Conn) -> State:
    if await conn.fetchval("SELECT to_regclass('promptsched_schema') IS NOT NULL"):
        row = await conn.fetchrow(
            "SELECT coalesce(max(version) FILTER (WHERE steps_done = steps), 0) AS version, "
            "coalesce(max(compat) FILTER (WHERE steps_done = steps), 0) AS compat "
            "FROM promptsched_schema"
        )
        assert row is not None
        return State(row["version"], row["compat"])
    if await conn.fetchval("SELECT to_regclass('promptsched_migrations') IS NOT NULL"):
        legacy = await conn.fetchval("SELECT max(version) FROM promptsched_migrations") or 0
        return State(legacy, legacy)
    return State(0, 0)


async def applied_version(conn: Conn) -> int:
    return (await state(conn)).version


def _refusal(current: State, latest: int) -> SchemaMismatch:
    return SchemaMismatch(
        f"the database schema is at version {current.version}, which runs releases from schema "
        f"{current.compat} on; this promptsched {__version__} has schema {latest}: "
        "deploy a newer release"
    )


async def check(conn: Conn) -> None:
    """Refuse to run against a schema that is behind, or ahead beyond this release's window,
    naming the fix."""
    current = await state(conn)
    latest = latest_version()
    if current.version < latest:
        raise SchemaMismatch(
            f"the database schema is at version {current.version}, this promptsched needs "
            f"{latest}: run `promptsched migrate`"
        )
    if current.compat > latest:
        raise _refusal(current, latest)


async def pending(conn: Conn) -> list[Migration]:
    """The migrations not yet applied completely (a refusal when the schema is beyond this
    release's window)."""
    current = await state(conn)
    latest = latest_version()
    if current.compat > latest:
        raise _refusal(current, latest)
    return [m for m in all_migrations() if m.version > current.version]


async def apply(
    conn: Conn,
    *,
    options: Options | None = None,
    chain: Sequence[Migration] | None = None,
) -> list[int]:
    """Apply every pending migration, each in its own transaction(s); returns the versions
    applied here (possibly none). ``chain`` replaces the files (tests)."""
    opts = options or Options()
    chain = list(chain) if chain is not None else all_migrations()
    compat = compat_of(chain)
    latest = chain[-1].version
    await _locked(conn, opts, "ledger", lambda: _prepare_ledger(conn))
    current = await state(conn)
    if current.compat > latest:
        raise _refusal(current, latest)
    applied: list[int] = []
    for migration in chain:
        if migration.version <= current.version:
            continue
        started = time.monotonic()
        if await _apply_one(conn, migration, compat[migration.version], opts):
            applied.append(migration.version)
            seconds = time.monotonic() - started
            log.info("migrate.applied", version=migration.version, name=migration.name,
                     seconds=round(seconds, 3))  # fmt: skip
            opts.say(f"applied {migration.label} in {seconds:.2f} s")
    return applied


async def _prepare_ledger(conn: Conn) -> None:
    await conn.execute(_LEGACY_TABLE)
    await conn.execute(_TABLE)
    await conn.execute(_ADOPT)


async def _apply_one(
    conn: Conn, migration: Migration, compat: int, opts: Options, restarts: int = 0
) -> bool:
    """Run the steps not done yet; False when another migrator finished it meanwhile."""
    for number, step in enumerate(migration.steps, start=1):
        if step.mode == "transaction":
            work = functools.partial(_transaction_step, conn, migration, number, compat, step)
            if await _locked(conn, opts, migration.label, work) is None:
                return False
            continue
        # One migrator at a time runs a step outside a transaction (a session lock: over a
        # direct connection, as `promptsched migrate` and the service's start use).
        # Polled, not waited for: a statement waiting holds a snapshot, and the other
        # migrator's CREATE INDEX CONCURRENTLY waits for every older snapshot to end.
        while True:
            if await conn.fetchval("SELECT pg_try_advisory_lock($1)", _STEP_LOCK_KEY):
                break
            await anyio.sleep(0.2)
        try:
            outcome = await _outside(conn, migration, number, compat, step, opts, restarts)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _STEP_LOCK_KEY)
        if outcome is not None:
            return outcome
    return True


async def _outside(
    conn: Conn,
    migration: Migration,
    number: int,
    compat: int,
    step: Step,
    opts: Options,
    restarts: int,
) -> bool | None:
    """A step outside a transaction, unless another migrator did it; a result for the whole
    migration when there is one to give (done elsewhere, or started over), else None."""
    total = len(migration.steps)
    done = await _steps_done(conn, migration.version)
    if done is not None and done >= number:
        return False if done >= total else None
    if step.mode == "batch":
        await _batches(conn, migration, step, opts)
    else:
        try:
            for statement in step.statements():
                alone = functools.partial(_alone, conn, statement, opts)
                await _retrying(opts, migration.label, alone)
        except asyncpg.IntegrityConstraintViolationError:
            # A unique index met rows the steps before it had put right, written again
            # meanwhile (by an older release): those steps once more, then this one.
            if restarts >= 3:
                raise
            log.info("migrate.restarted", version=migration.version)
            forget = functools.partial(_forget_steps, conn, migration.version)
            await _locked(conn, opts, migration.label, forget)
            return await _apply_one(conn, migration, compat, opts, restarts + 1)
    record = functools.partial(_record, conn, migration, number, compat)
    if not await _locked(conn, opts, migration.label, record):
        return False  # another migrator finished it meanwhile
    return None


async def _forget_steps(conn: Conn, version: int) -> None:
    await conn.execute("UPDATE promptsched_schema SET steps_done = 0 WHERE version = $1", version)


async def _steps_done(conn: Conn, version: int) -> int | None:
    done: int | None = await conn.fetchval(
        "SELECT steps_done FROM promptsched_schema WHERE version = $1", version
    )
    return done


async def _transaction_step(
    conn: Conn, migration: Migration, number: int, compat: int, step: Step
) -> bool | None:
    """Inside the locked transaction: the step unless another migrator did it (None when
    the whole migration is done)."""
    done = await _steps_done(conn, migration.version) or 0
    if done >= len(migration.steps):
        return None
    if done >= number:
        return True
    await conn.execute(step.sql)
    await _record(conn, migration, number, compat)
    return True


async def _record(conn: Conn, migration: Migration, number: int, compat: int) -> bool:
    """Step ``number`` done; False when another migrator had recorded it already."""
    done = await _steps_done(conn, migration.version)
    if done is not None and done >= number:
        return False
    complete = number >= len(migration.steps)
    await conn.execute(
        "INSERT INTO promptsched_schema "
        "(version, name, steps, steps_done, compat, release, applied_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $7 THEN now() END) "
        "ON CONFLICT (version) DO UPDATE SET steps_done = greatest("
        "promptsched_schema.steps_done, excluded.steps_done), applied_at = excluded.applied_at",
        migration.version, migration.name, len(migration.steps), number, compat, __version__,
        complete,
    )  # fmt: skip
    if complete and (migration.version <= LEGACY_LAST or compat > LEGACY_LAST):
        # What releases before this scheme read: their own rows, and a newer one only when
        # this migration leaves them behind.
        await conn.execute(
            "INSERT INTO promptsched_migrations (version, name) VALUES ($1, $2) "
            "ON CONFLICT (version) DO NOTHING",
            migration.version, migration.name,
        )  # fmt: skip
    return True


async def _batches(conn: Conn, migration: Migration, step: Step, opts: Options) -> None:
    """A bounded statement (it changes at most a batch of rows, and none once all are done)
    again and again, each time in a transaction of its own."""
    total = 0
    while True:
        status = await _locked(conn, opts, migration.label, lambda: conn.execute(step.sql))
        changed = int(status.split()[-1]) if status.split()[-1].isdigit() else 0
        total += changed
        if changed == 0:
            break
    log.info("migrate.backfilled", version=migration.version, rows=total)


async def _alone(conn: Conn, statement: str, opts: Options) -> None:
    """One statement outside a transaction (CREATE INDEX CONCURRENTLY), after dropping the
    INVALID index an interrupted build of it left behind. Its waits for locks (a build waits
    for every transaction that may use the table) are as short as a transaction's."""
    await conn.execute(f"SET lock_timeout = '{int(opts.lock_timeout * 1000)}ms'")
    try:
        match = _INDEX_NAME.search(statement)
        if match is not None:
            await _drop_invalid_leftover(conn, match.group(1))
        await conn.execute(statement)
    finally:
        await conn.execute("RESET lock_timeout")


async def _drop_invalid_leftover(conn: Conn, name: str) -> None:
    while True:
        row = await conn.fetchrow(
            "SELECT i.indisvalid, EXISTS (SELECT FROM pg_stat_progress_create_index p "
            "WHERE p.index_relid = i.indexrelid) AS building "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = $1 AND c.relnamespace = current_schema()::regnamespace",
            name,
        )
        if row is None or row["indisvalid"]:
            return
        if not row["building"]:
            log.info("migrate.invalid_index_dropped", index=name)
            await conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
            return
        await anyio.sleep(0.5)  # another migrator builds it: wait for its outcome


async def _locked(conn: Conn, opts: Options, what: str, work: Callable[[], Awaitable[Any]]) -> Any:
    """``work`` in a transaction holding the migrators' lock, its statements waiting at most
    ``lock_timeout`` for a table's lock; retried after a backoff when one could not."""

    async def attempt() -> Any:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{int(opts.lock_timeout * 1000)}ms'")
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            return await work()

    return await _retrying(opts, what, attempt)


async def _retrying(opts: Options, what: str, attempt: Callable[[], Awaitable[Any]]) -> Any:
    deadline = time.monotonic() + opts.patience
    tries = 0
    while True:
        tries += 1
        try:
            return await attempt()
        except asyncpg.LockNotAvailableError:
            if time.monotonic() > deadline:
                raise
            wait = min(10.0, 0.25 * 2 ** min(tries, 6)) * random.uniform(0.5, 1.0)
            log.info("migrate.lock_busy", migration=what, attempt=tries,
                     retry_in=round(wait, 2))  # fmt: skip
            opts.say(f"{what}: a table it needs is busy; trying again in {wait:.1f} s")
            await anyio.sleep(wait)


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


# --- the plan: which locks each pending migration takes -----------------------------------

_LOCK_RULES: tuple[tuple[str, str], ...] = (
    (r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?\w*\s*ON\s+"
     r"(?:ONLY\s+)?(\w+)", "SHARE UPDATE EXCLUSIVE"),
    (r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?\w*\s*ON\s+(?:ONLY\s+)?(\w+)",
     "SHARE"),
    (r"ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?(\w+)\s+VALIDATE\s+CONSTRAINT",
     "SHARE UPDATE EXCLUSIVE"),
    (r"ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?(\w+)\b(?!\s+VALIDATE\b)",
     "ACCESS EXCLUSIVE"),
    (r"REFERENCES\s+(\w+)", "SHARE ROW EXCLUSIVE"),
    (r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:CONSTRAINT\s+)?TRIGGER\s+\w+.*?\bON\s+(\w+)",
     "SHARE ROW EXCLUSIVE"),
    (r"DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(\w+)", "ACCESS EXCLUSIVE"),
    (r"\bANALYZE\s+(\w+)", "SHARE UPDATE EXCLUSIVE"),
    (r"(?<!ON )(?<!FOR )\bUPDATE\s+(?!OF\b)(\w+)", "ROW EXCLUSIVE"),
    (r"\bDELETE\s+FROM\s+(\w+)", "ROW EXCLUSIVE"),
    (r"\bINSERT\s+INTO\s+(\w+)", "ROW EXCLUSIVE"),
)  # fmt: skip
_STRENGTH = ("ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE",
             "ACCESS EXCLUSIVE")  # fmt: skip
# What each lock stops while it is held, in the words of an operator.
BLOCKS = {
    "SHARE": "writes to {table} wait (reads go on)",
    "SHARE ROW EXCLUSIVE": "writes to {table} wait (reads go on)",
    "ACCESS EXCLUSIVE": "every read and write of {table} waits",
}


def _code(sql: str) -> str:
    """The statements without comments, quoted strings and function bodies (what they say
    is not run by the migration)."""
    sql = _strip_comments(sql)
    sql = re.sub(r"\$(\w*)\$.*?\$\1\$", "''", sql, flags=re.S)
    return re.sub(r"'(?:[^']|'')*'", "''", sql)


def locks_of(step: Step, index_tables: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{table: strongest lock}`` the step takes on tables that exist before it (a table it
    creates blocks nobody), read from its statements; ``index_tables`` names the table of
    each index the database has (an index dropped locks its table)."""
    code = _code(step.sql)
    found: dict[str, str] = {}
    for concurrently, name in re.findall(
        r"DROP\s+INDEX\s+(CONCURRENTLY\s+)?(?:IF\s+EXISTS\s+)?(\w+)", code, re.I
    ):
        table = (index_tables or {}).get(name.lower(), f"the table of index {name}")
        found[table] = "SHARE UPDATE EXCLUSIVE" if concurrently else "ACCESS EXCLUSIVE"
    created = {m.lower() for m in re.findall(
        r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", code, re.I)}  # fmt: skip
    for statement in code.split(";"):
        for pattern, lock in _LOCK_RULES:
            for table in re.findall(pattern, statement, re.I | re.S):
                table = table.lower()
                if table in created or table in ("only", "if"):
                    continue
                if _STRENGTH.index(lock) > _STRENGTH.index(found.get(table, "ROW EXCLUSIVE")):
                    found[table] = lock
                else:
                    found.setdefault(table, lock)
            if re.search(pattern, statement, re.I | re.S) and pattern.startswith(r"CREATE\s+("):
                break  # an index statement is only that
    return found


async def index_tables(conn: Conn) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT indexname, tablename FROM pg_indexes WHERE schemaname = current_schema()"
    )
    return {row["indexname"]: row["tablename"] for row in rows}


def plan(
    pending_migrations: Sequence[Migration], indexes: Mapping[str, str] | None = None
) -> list[str]:
    """Lines for ``promptsched migrate --plan``."""
    lines: list[str] = []
    if not pending_migrations:
        return ["schema is up to date: nothing to apply"]
    compat = compat_of(all_migrations())
    for migration in pending_migrations:
        oldest = compat.get(migration.version, 0)
        lines.append(f"{migration.label} (after it, releases from schema {oldest} on still run)")
        for number, step in enumerate(migration.steps, start=1):
            kind = {"transaction": "in a transaction", "no-transaction": "outside a transaction",
                    "batch": "in bounded batches"}[step.mode]  # fmt: skip
            locks = locks_of(step, indexes)
            held = ", ".join(f"{lock} on {table}" for table, lock in sorted(locks.items()))
            lines.append(f"  step {number}, {kind}: {held or 'no lock on an existing table'}")
            for table, lock in sorted(locks.items()):
                if _STRENGTH.index(lock) >= _STRENGTH.index("SHARE"):
                    lines.append("    while it is held, " + BLOCKS[lock].format(table=table))
    return lines
