"""Connection pools with the codecs every query relies on."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import asyncpg
import structlog

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

# A connection of our own or one borrowed from a pool (generic only in the type stubs).
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
T = TypeVar("T")

log = structlog.get_logger("store")


def is_stale(exc: BaseException) -> bool:
    """A statement prepared before a schema change (an ``ALTER TABLE`` of the next release,
    run by ``promptsched migrate`` while this replica serves) no longer fits it: PostgreSQL
    refuses a cached plan whose result type changed ("cached plan must not change result
    type", asyncpg's InvalidCachedStatementError) before running it, and asyncpg dropped the
    statements it had cached on every connection of the pool. (Not asyncpg's
    OutdatedSchemaCacheError: that one comes after the statement ran, and outside a
    transaction its write is already committed, so running it again would repeat it.)"""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return is_stale(exc.exceptions[0])
    if isinstance(exc, asyncpg.InvalidCachedStatementError):
        return True
    return isinstance(exc, asyncpg.FeatureNotSupportedError) and (
        "cached plan must not change result type" in str(exc)
    )


async def retry_stale(work: Callable[[], Awaitable[T]]) -> T:
    """Run a unit of work (a request, a role's batch: its transactions and what it decides on
    their rows) and run it once more if a statement prepared before a schema change failed
    in it. Outside a transaction asyncpg prepares such a statement again and retries it by
    itself; inside one the error aborts the transaction, which rolled back when it reached
    here, so only the whole transaction can be tried again, with statements prepared anew.
    Once: a schema change is rare, and a second failure is another problem, raised."""
    try:
        return await work()
    except Exception as exc:
        if not is_stale(exc):
            raise
        log.info("store.statements_prepared_again", error=type(exc).__name__)
    return await work()


# asyncpg looks up an array type the first time a statement on a connection binds or returns
# one: a catalog query of 15-30 ms here. Left to the first claim, finish or tick of each new
# pooled connection, that lookup lands in the middle of a rush. One probe of every array type
# our queries use, when a pooled connection opens, resolves them all at once (a test keeps the
# list complete). The codecs live in this client connection and a type's OID is the same on
# every server connection, so behind a transaction pooler one probe still serves every later
# statement. Dedicated connections (CLI, LISTEN) skip it: they run few statements,
# none of them in a rush.
_ARRAY_TYPES = (
    "bigint[]",
    "boolean[]",
    "double precision[]",
    "integer[]",
    "interval[]",
    "jsonb[]",
    "record[]",
    "text[]",
    "timestamptz[]",
    "uuid[]",
)
_PROBE = "SELECT " + ", ".join(f"NULL::{name}" for name in _ARRAY_TYPES)


async def _init(conn: asyncpg.Connection[Any]) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _init_pooled(conn: asyncpg.Connection[Any]) -> None:
    # One transaction, so that through a transaction pooler (PgBouncer) the probe runs on one
    # server connection: asyncpg's type lookup turns `jit` off with a session-level
    # set_config and back on afterwards, and split over two server connections that would
    # leave one of them changed for its next client.
    async with conn.transaction():
        await _init(conn)
        await conn.fetchrow(_PROBE)


async def _no_session_reset(conn: asyncpg.Connection[Any]) -> None:
    """Pooled connections carry no session state of ours (no SET, LISTEN or session advisory
    lock: LISTEN lives on its own connection, leadership is a row), so they can go through a
    transaction pooler, and the default reset query, a round trip on
    every release, buys nothing. asyncpg still rolls back a transaction left open."""


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    application_name: str = "promptsched",
    statement_cache_size: int = 100,
) -> asyncpg.Pool[Any]:
    """``statement_cache_size=0`` makes asyncpg use only unnamed statements, parsed again with
    every execution (Parse, Bind and Execute in one round trip), which is what a transaction
    pooler without prepared-statement support (PgBouncer < 1.21) can pass through."""
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        statement_cache_size=statement_cache_size,
        init=_init_pooled,
        reset=_no_session_reset,
        server_settings={"application_name": application_name},
        # Bounded so a vanished database turns into an error the roles retry, not a hang.
        timeout=10,
        command_timeout=60,
    )
    assert pool is not None
    return pool


async def connect(dsn: str, *, application_name: str = "promptsched") -> asyncpg.Connection[Any]:
    """A dedicated connection (CLI, LISTEN). It caches no prepared statement: it runs a
    handful, and the CLI's may go through a transaction pooler that cannot keep them."""
    conn: asyncpg.Connection[Any] = await asyncpg.connect(
        dsn,
        timeout=10,
        statement_cache_size=0,
        server_settings={"application_name": application_name},
    )
    await _init(conn)
    return conn
