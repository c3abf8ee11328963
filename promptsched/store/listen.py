"""LISTEN on a dedicated connection that reconnects by itself, turning NOTIFY into wake-ups,
and checks that they arrive."""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.store import pool as pools
from promptsched.store import queries

log = structlog.get_logger("listen")

CHANNEL_SCHEDULES = "promptsched_schedules"
CHANNEL_RUNS = "promptsched_runs"
CHANNEL_OUTBOX = "promptsched_outbox"
CHANNEL_PROGRESS = "promptsched_progress"
# The self-check's channel (store/sql/queries/listen.sql sends on it).
CHANNEL_CHECK = "promptsched_listen_check"

_HINT = (
    "wake-ups are not arriving, so runs start only when the roles poll: LISTEN must run on a "
    "session connection, not through a transaction pooler (set PROMPTSCHED_DIRECT_DATABASE_URL)"
)


class Listener:
    """Calls ``handlers[channel](payload)`` for each notification. After a reconnect every
    handler is called with ``None``, since notifications sent meanwhile were lost.

    The self-check: after subscribing, and every ``check_interval`` seconds, a test NOTIFY is
    sent through ``check_db`` (the pool every producer uses; without it, this connection) and
    must arrive here within ``check_timeout``. A LISTEN that went through a transaction pooler
    subscribes a server connection the pooler hands to other clients, and its notifications are
    dropped without an error anywhere: only a round trip shows it. ``wakeups_ok`` is the last
    result (None before the first), ``on_check`` hears each one.
    """

    def __init__(
        self,
        dsn: str,
        handlers: Mapping[str, Callable[[str | None], None]],
        *,
        check_db: queries.DB | None = None,
        on_check: Callable[[bool], None] | None = None,
        check_interval: float = 30.0,
        check_timeout: float = 5.0,
    ) -> None:
        self.dsn = dsn
        self.handlers = dict(handlers)
        self.connected = False
        self.check_db = check_db
        self.on_check = on_check
        self.check_interval = check_interval
        self.check_timeout = check_timeout
        self.wakeups_ok: bool | None = None
        # Every replica hears every replica's checks: each waits only for its own tokens.
        self._prefix = secrets.token_hex(8)
        self._numbers = itertools.count(1)
        self._waiting: dict[str, anyio.Event] = {}

    @property
    def healthy(self) -> bool:
        """Subscribed, and the last self-check (if any yet) came back."""
        return self.connected and self.wakeups_ok is not False

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        if channel == CHANNEL_CHECK:
            arrived = self._waiting.get(str(payload))
            if arrived is not None:
                arrived.set()
            return
        handler = self.handlers.get(channel)
        if handler is not None:
            handler(str(payload))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        failures = 0
        while True:
            lost = anyio.Event()
            try:
                conn = await pools.connect(self.dsn, application_name="promptsched-listen")
            except Exception as exc:  # asyncpg raises more than PostgresError mid-handshake
                failures += 1
                log.warning("listen.connect_failed", error=repr(exc), failures=failures)
                if not started:
                    raise
                await anyio.sleep(min(5.0, 0.2 * 2 ** min(failures, 5)))
                continue
            try:
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for channel in (*self.handlers, CHANNEL_CHECK):
                    await conn.add_listener(channel, self._on_notify)
                self.connected = True
                if failures:
                    log.info("listen.reconnected", failures=failures)
                    for handler in self.handlers.values():
                        handler(None)
                failures = 0
                # Before "started": a replica is ready only once wake-ups are known to arrive
                # (or known not to, which it then reports).
                await self.check(conn)
                if not started:
                    started = True
                    task_status.started()
                await self._watch(conn, lost)
            except Exception as exc:  # the connection died while subscribing: start over
                if not started:
                    raise
                failures += 1
                log.warning("listen.subscribe_failed", error=repr(exc), failures=failures)
            finally:
                self.connected = False
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await _close(conn)
            failures += 1
            if failures > 1:  # lost again right after (re)connecting: do not spin
                await anyio.sleep(min(5.0, 0.2 * 2 ** min(failures, 5)))

    async def _watch(self, conn: asyncpg.Connection[Any], lost: anyio.Event) -> None:
        # A silent network cut would never fire the termination listener: probe now and then.
        next_check = time.monotonic() + self.check_interval
        while not lost.is_set():
            with anyio.move_on_after(min(5.0, max(0.0, next_check - time.monotonic()))):
                await lost.wait()
            if lost.is_set():
                break
            try:
                with anyio.fail_after(5):
                    await conn.execute("SELECT 1")
            except Exception:  # whatever asyncpg raises, the session is gone
                break
            if time.monotonic() >= next_check:
                await self.check(conn)
                next_check = time.monotonic() + self.check_interval
        log.warning("listen.connection_lost")

    async def check(self, conn: asyncpg.Connection[Any]) -> bool | None:
        """Send a test notification and wait for it on ``conn``; None when it could not be
        sent (the database is unreachable: the other roles report that)."""
        token = f"{self._prefix}:{next(self._numbers)}"
        arrived = self._waiting[token] = anyio.Event()
        started = time.monotonic()
        try:
            try:
                with anyio.fail_after(self.check_timeout):
                    target = conn if self.check_db is None else self.check_db
                    await queries.listen_check_notify(target, token)
            except Exception as exc:  # a send that failed tells nothing about LISTEN
                log.warning("listen.check_not_sent", error=repr(exc))
                return None
            with anyio.move_on_after(self.check_timeout):
                await arrived.wait()
        finally:
            del self._waiting[token]
        ok = arrived.is_set()
        if not ok and conn.is_closed():
            return None  # the connection died meanwhile: the reconnect checks again
        if not ok:
            log.error("listen.check_failed", waited=self.check_timeout, hint=_HINT)
        elif self.wakeups_ok is False:
            log.info("listen.check_recovered")
        else:
            log.debug("listen.check_ok", seconds=round(time.monotonic() - started, 4))
        self.wakeups_ok = ok
        if self.on_check is not None:
            self.on_check(ok)
        return ok


async def _close(conn: asyncpg.Connection[Any]) -> None:
    """Close politely; a connection that died already is only torn down."""
    try:
        await conn.close()
    except Exception:
        conn.terminate()


async def round_trip(listen_dsn: str, send: queries.DB, *, wait: float = 3.0) -> bool:
    """Whether a NOTIFY sent through ``send`` arrives at a LISTEN on a new connection to
    ``listen_dsn`` within ``wait`` seconds: the listener's self-check, once (doctor)."""
    token = f"doctor:{secrets.token_hex(8)}"
    arrived = anyio.Event()

    def heard(conn: Any, pid: int, channel: str, payload: object) -> None:
        if payload == token:
            arrived.set()

    conn = await pools.connect(listen_dsn, application_name="promptsched-doctor")
    try:
        await conn.add_listener(CHANNEL_CHECK, heard)
        await queries.listen_check_notify(send, token)
        with anyio.move_on_after(wait):
            await arrived.wait()
    finally:
        await _close(conn)
    return arrived.is_set()
