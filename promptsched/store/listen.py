"""LISTEN on a dedicated connection that reconnects by itself, turning NOTIFY into wake-ups."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio
import asyncpg
import structlog
from anyio.abc import TaskStatus

from promptsched.store import pool as pools

log = structlog.get_logger("listen")

CHANNEL_SCHEDULES = "promptsched_schedules"
CHANNEL_RUNS = "promptsched_runs"
CHANNEL_OUTBOX = "promptsched_outbox"
CHANNEL_PROGRESS = "promptsched_progress"


class Listener:
    """Calls ``handlers[channel](payload)`` for each notification. After a reconnect every
    handler is called with ``None``, since notifications sent meanwhile were lost."""

    def __init__(self, dsn: str, handlers: Mapping[str, Callable[[str | None], None]]) -> None:
        self.dsn = dsn
        self.handlers = dict(handlers)
        self.connected = False

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: object) -> None:
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
                for channel in self.handlers:
                    await conn.add_listener(channel, self._on_notify)
                self.connected = True
                if failures:
                    log.info("listen.reconnected", failures=failures)
                    for handler in self.handlers.values():
                        handler(None)
                failures = 0
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
        while not lost.is_set():
            with anyio.move_on_after(5):
                await lost.wait()
            if lost.is_set():
                break
            try:
                with anyio.fail_after(5):
                    await conn.execute("SELECT 1")
            except Exception:  # whatever asyncpg raises, the session is gone
                break
        log.warning("listen.connection_lost")


async def _close(conn: asyncpg.Connection[Any]) -> None:
    """Close politely; a connection that died already is only torn down."""
    try:
        await conn.close()
    except Exception:
        conn.terminate()
