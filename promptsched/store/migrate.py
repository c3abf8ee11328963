"""Forward-only schema migrations, applied in order under an advisory lock."""

from __future__ import annotations

from promptsched.errors import SchemaMismatch
from promptsched.store.pool import Conn
from promptsched.store.sqlfiles import migrations

# Any constant shared by every replica; two replicas starting at once serialize on it.
_LOCK_KEY = 0x7072_6F6D_7074

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS promptsched_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


def latest_version() -> int:
    return migrations()[-1][0]


async def applied_version(conn: Conn) -> int:
    exists = await conn.fetchval("SELECT to_regclass('promptsched_migrations') IS NOT NULL")
    if not exists:
        return 0
    version: int | None = await conn.fetchval("SELECT max(version) FROM promptsched_migrations")
    return version or 0


async def apply(conn: Conn) -> list[int]:
    """Apply every pending migration; returns the versions applied (possibly none)."""
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute(_CREATE_TABLE)
        current = await applied_version(conn)
        if current > latest_version():
            raise SchemaMismatch(
                f"the database schema is at version {current}, newer than this promptsched "
                f"({latest_version()}); upgrade promptsched"
            )
        for version, name, sql in migrations():
            if version <= current:
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO promptsched_migrations (version, name) VALUES ($1, $2)", version, name
            )
            applied.append(version)
    return applied


async def check(conn: Conn) -> None:
    """Refuse to run against a schema that is behind or ahead, naming the fix."""
    current = await applied_version(conn)
    latest = latest_version()
    if current < latest:
        raise SchemaMismatch(
            f"the database schema is at version {current}, this promptsched needs {latest}: "
            "run `promptsched migrate`"
        )
    if current > latest:
        raise SchemaMismatch(
            f"the database schema is at version {current}, newer than this promptsched "
            f"({latest}); upgrade promptsched"
        )
