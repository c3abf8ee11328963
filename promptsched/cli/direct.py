"""Direct mode: the CLI's operations over one database connection, as the database's operator
(every owner's schedules), returning the very JSON the HTTP API returns for them."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import anyio
import asyncpg
import structlog

from promptsched import config as configuration
from promptsched import errors
from promptsched.cli import common
from promptsched.clock import Clock
from promptsched.domain import RunStatus, Schedule
from promptsched.errors import ValidationError
from promptsched.ops import budgets as budget_ops
from promptsched.ops import explain as explaining
from promptsched.ops import fleet, inputs, notifications, validate, views
from promptsched.ops import followups as followup_ops
from promptsched.ops import runs as run_ops
from promptsched.ops import schedules as schedule_ops
from promptsched.ops import status as fleet_status
from promptsched.schedule import spec
from promptsched.store import listen, migrate, queries
from promptsched.store import pool as pools
from promptsched.tools.base import Catalog

CLI_ACTOR = "cli"
# The fields whose checks the running fleet decides (its providers, allowlist, tools).
FLEET_FIELDS = frozenset({"provider", "model", "fallback", "notify", "params", "escalate"})
LOCAL = "checked against this shell's environment: no replica is running"
WATCH_POLL = 1.0  # seconds between status checks while watching a run directly
ENDED = frozenset({*(s.value for s in RunStatus if s.finished), "deleted"})


async def _tool_catalog(config: configuration.Config, params: Any) -> Catalog | None:
    """This server's tools, asked for only when the schedule lists some (MCP servers are
    started once to list theirs)."""
    if not isinstance(params, dict) or "tools" not in params:
        return None
    from promptsched.tools import registry
    from promptsched.tools.settings import parse_mcp_servers

    tools = registry.ToolRegistry.from_settings(
        allow=config.tools_allow,
        mcp=parse_mcp_servers(config.mcp_servers, config.mcp_raw),
    )
    previous = structlog.get_config()
    # A server that fails says so on stderr: stdout carries the command's (JSON) output.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )
    try:
        return await registry.discover(tools)
    finally:
        structlog.configure(**previous)


class DirectBackend:
    """Over one database connection, with no owner scope (the database's operator sees
    every owner); new schedules belong to ``--owner`` (default ``default``)."""

    def __init__(
        self, conn: asyncpg.Connection[Any], dsn: str, config: configuration.Config, clock: Clock
    ) -> None:
        self.conn, self.dsn, self.config, self.clock = conn, dsn, config, clock
        self._noted = False

    @contextlib.asynccontextmanager
    async def _fleet(self) -> AsyncIterator[fleet.FleetView]:
        """What the running fleet published, for the checks in the block (this shell's
        environment when no replica runs). Said once on stderr when the block succeeds
        (stdout carries the answer); a refusal of what the fleet decides says it instead, in
        its one line."""
        found = await fleet.view(self.conn, self.clock, lambda: fleet.local(self.config))
        try:
            yield found
        except ValidationError as exc:
            top = exc.field.split(".", 1)[0].split("[", 1)[0]
            if found.source == "local" and top in FLEET_FIELDS:
                raise ValidationError(exc.field, f"{exc.message} ({LOCAL}).") from None
            raise
        if found.note is not None and not self._noted:
            self._noted = True
            print(f"promptsched: note: {found.note}", file=sys.stderr)

    async def _checks(self, found: fleet.FleetView, params: Any) -> dict[str, Any]:
        """Input checks: the fleet's providers and allowlist; its tools when it published
        them, else this environment's (asked for only when the schedule lists tools)."""
        uses_tools = isinstance(params, dict) and "tools" in params
        tools = found.catalog if found.source == "fleet" else None
        if uses_tools and tools is None:
            tools = await _tool_catalog(self.config, params)
        return found.checks(tools if uses_tools else None)

    async def _schedule_row(self, schedule_id: int) -> Schedule:
        row = await queries.schedule_get(self.conn, schedule_id, None)
        if row is None:
            raise errors.NotFound("schedule", schedule_id)
        return row

    async def create_schedule(self, body: dict[str, Any], owner: str | None) -> dict[str, Any]:
        async with self._fleet() as found:
            values = inputs.validate(body, **await self._checks(found, body.get("params")))
        async with self.conn.transaction():
            row = await schedule_ops.create_schedule(
                self.conn, self.clock, values, owner=owner or "default", actor=CLI_ACTOR,
                max_schedules=self.config.owner_max_schedules,
            )  # fmt: skip
        data = views.schedule(row, with_next=True, reveal_secret=True)
        return _warned(data, fleet.schedule_warnings(found, values))

    async def list_schedules(
        self, *, owner: str | None, name: str | None, limit: int
    ) -> list[dict[str, Any]]:
        rows = await queries.schedule_search(
            self.conn, owner=owner, enabled=None, name=name, after_id=0, limit=limit
        )
        return [views.schedule(row) for row in rows]

    async def get_schedule(self, schedule_id: int) -> dict[str, Any]:
        row = await self._schedule_row(schedule_id)
        spend = await budget_ops.schedule_spend(self.conn, row, self.clock)
        return {**views.schedule(row, with_next=True), "spend": spend}

    async def schedule_names(self, ids: list[int]) -> dict[int, tuple[str, str]]:
        found = {}
        for schedule_id in ids:  # one connection: one query at a time
            row = await queries.schedule_get(self.conn, schedule_id, None)
            if row is not None:
                found[schedule_id] = (row.name, row.timezone)
        return found

    async def update_schedule(
        self, schedule_id: int, patch: dict[str, Any], version: int | None
    ) -> dict[str, Any]:
        before = await self._schedule_row(schedule_id)
        async with self._fleet() as found:
            row = await schedule_ops.update_schedule(
                self.conn,
                self.clock,
                schedule_id,
                patch,
                owner=None,
                actor=CLI_ACTOR,
                expected_version=version,
                **await self._checks(found, patch.get("params")),
            )
        rotated = views.webhook_secret(before) != views.webhook_secret(row)
        data = views.schedule(row, with_next=True, reveal_secret=rotated)
        return _warned(data, fleet.schedule_warnings(found, row))

    async def pause_schedule(
        self, schedule_id: int, until: str | None, reason: str | None
    ) -> dict[str, Any]:
        when = validate.instant(until, "until") if until is not None else None
        if when is not None and when <= await schedule_ops.db_now(self.conn, self.clock):
            raise ValidationError("until", "must be in the future")
        row = await schedule_ops.pause_schedule(
            self.conn, schedule_id, owner=None, actor=CLI_ACTOR, until=when, reason=reason
        )
        return views.schedule(row, with_next=True)

    async def resume_schedule(self, schedule_id: int) -> dict[str, Any]:
        row = await schedule_ops.resume_schedule(
            self.conn, schedule_id, owner=None, actor=CLI_ACTOR
        )
        return views.schedule(row, with_next=True)

    async def trigger_schedule(self, schedule_id: int) -> dict[str, Any]:
        run = await schedule_ops.trigger_schedule(
            self.conn, self.clock, schedule_id, owner=None, actor=CLI_ACTOR
        )
        data = await run_ops.load_run(self.conn, run["id"], None)
        idle = [fleet.idle_words(run["id"])] if await self.idle() else []
        return _warned(data, idle)

    async def idle(self) -> bool:
        return not await fleet.workers_running(self.conn, self.clock)

    async def backfill_schedule(self, schedule_id: int, start: str, end: str) -> dict[str, Any]:
        runs = await schedule_ops.backfill_schedule(
            self.conn,
            self.clock,
            schedule_id,
            validate.instant(start, "start"),
            validate.instant(end, "end"),
            owner=None,
            actor=CLI_ACTOR,
        )
        return views.backfill(runs)

    async def delete_schedule(self, schedule_id: int) -> None:
        await schedule_ops.delete_schedule(self.conn, schedule_id, owner=None, actor=CLI_ACTOR)

    async def schedule_history(self, schedule_id: int, limit: int) -> list[dict[str, Any]]:
        rows = await queries.schedule_change_page(self.conn, schedule_id, None, None, limit)
        if not rows:
            await self._schedule_row(schedule_id)
        return [views.change(row) for row in rows]

    async def explain(self, schedule_id: int, at: str) -> dict[str, Any]:
        row = await self._schedule_row(schedule_id)
        instant, note = explaining.resolve_at(at, row)
        now = await schedule_ops.db_now(self.conn, self.clock)
        changes = await queries.schedule_change_around(self.conn, schedule_id, instant)
        runs = await queries.run_list_for_slot(self.conn, schedule_id, instant)
        return explaining.explain(explaining.Facts(row, instant, now, changes, runs, note=note))

    async def list_runs(
        self, *, schedule_id: int | None, status: str | None, limit: int
    ) -> list[dict[str, Any]]:
        if schedule_id is not None:
            await self._schedule_row(schedule_id)
        rows = await queries.run_list(
            self.conn,
            schedule_id=schedule_id,
            status=status,
            owner=None,
            before_id=None,
            limit=limit,
        )
        return [views.run(row) for row in rows]

    async def get_run(self, run_id: int) -> dict[str, Any]:
        return await run_ops.load_run(self.conn, run_id, None)

    async def diff_runs(self, run_id: int, other_id: int) -> dict[str, Any]:
        return await run_ops.diff_runs(self.conn, run_id, other_id, None)

    async def cancel_run(self, run_id: int) -> dict[str, Any]:
        row = await run_ops.cancel_run(self.conn, self.clock, run_id, owner=None, actor=CLI_ACTOR)
        return await run_ops.load_run(self.conn, row["id"], None)

    async def replay_run(self, run_id: int) -> dict[str, Any]:
        row = await run_ops.replay_run(self.conn, self.clock, run_id, owner=None, actor=CLI_ACTOR)
        return await run_ops.load_run(self.conn, row["id"], None)

    async def watch(self, run_id: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The run's progress from the same NOTIFY channel the API's stream reads (on a
        second connection), and its status from the runs table until it is final."""
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](1000)

        def on_notify(conn: Any, pid: int, channel: str, payload: object) -> None:
            try:
                event = json.loads(str(payload))
            except ValueError:
                return
            if isinstance(event, dict) and event.get("run_id") == run_id:
                with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                    send.send_nowait(event)  # progress is ephemeral: a flood drops events

        with send, receive:
            listener = await pools.connect(self.dsn, application_name="promptsched-cli-watch")
            try:
                await listener.add_listener(listen.CHANNEL_PROGRESS, on_notify)
                status = await queries.run_get_status(self.conn, run_id, None)
                if status is None:
                    raise errors.NotFound("run", run_id)
                yield "subscribed", {}
                while status not in ENDED:
                    event: dict[str, Any] | None = None
                    with anyio.move_on_after(WATCH_POLL):
                        event = await receive.receive()
                    if event is not None:
                        yield "progress", event
                        continue
                    status = await queries.run_get_status(self.conn, run_id, None) or "deleted"
                while True:  # events that arrived with the final status
                    try:
                        yield "progress", receive.receive_nowait()
                    except anyio.WouldBlock:
                        break
                yield "done", {"run_id": run_id, "status": status}
            finally:
                await listener.close()

    async def dead_notifications(self, limit: int) -> list[dict[str, Any]]:
        return await notifications.list_dead_notifications(self.conn, None, limit=limit)

    async def replay_notification(self, notification_id: int) -> dict[str, Any]:
        try:
            data = await notifications.replay_notification(
                self.conn, notification_id, None, clock=self.clock
            )
        except ValidationError as exc:  # it exists but is not dead: a conflict, as in the API
            raise errors.StateConflict(exc.message) from None
        if data is None:
            raise errors.NotFound("notification", notification_id)
        return data

    async def preview(self, query: dict[str, Any]) -> dict[str, Any]:
        return preview_locally(query, self.clock)

    # Follow-ups: direct mode acts for --owner (default ``default``).
    async def create_followup(
        self, body: dict[str, Any], owner: str | None
    ) -> tuple[bool, dict[str, Any]]:
        async with self._fleet() as found:
            return await followup_ops.create(
                self.conn, self.clock, body, owner=owner or "default", actor=CLI_ACTOR,
                **await self._checks(found, body.get("params")),
            )  # fmt: skip

    async def get_followup(self, key: str, owner: str | None) -> dict[str, Any]:
        return await followup_ops.show(self.conn, owner or "default", key)

    async def cancel_followup(self, key: str, owner: str | None) -> None:
        await followup_ops.cancel(
            self.conn, owner or "default", key, actor=CLI_ACTOR, clock=self.clock
        )

    async def list_followup_runs(
        self, key: str, *, status: str | None, limit: int, owner: str | None
    ) -> list[dict[str, Any]]:
        return await followup_ops.runs(
            self.conn, owner or "default", key, status, before_id=None, limit=limit
        )

    async def list_followups(
        self, state: str | None, limit: int, owner: str | None
    ) -> list[dict[str, Any]]:
        return await followup_ops.list_(
            self.conn, owner or "default", state, before_id=None, limit=limit
        )

    async def status(self) -> dict[str, Any]:
        return await fleet_status.gather(self.conn, self.clock)

    async def get_budget(self, owner: str | None) -> dict[str, Any]:
        return await budget_ops.owner_budget(self.conn, owner or "default", self.clock)

    async def set_budget(self, owner: str | None, budget: dict[str, Any]) -> dict[str, Any]:
        data = await budget_ops.set_owner_budget(self.conn, owner or "default", budget, self.clock)
        async with self._fleet() as found:
            warning = fleet.cost_warning(found, data["budget"], None, "budget")
        return _warned(data, [warning] if warning else [])


def _warned(data: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """The API's answer: ``warnings`` only when there are some."""
    return {**data, "warnings": warnings} if warnings else data


def preview_locally(query: dict[str, Any], clock: Clock) -> dict[str, Any]:
    """The preview the API answers, computed here: pure schedule math, no database."""
    options = {"dst_gap": query["dst_gap"], "dst_fold": query["dst_fold"]}
    parsed = spec.parse_line(query["expression"], query["timezone"], **options)
    start = (
        common.instant(query["from"], "--from")
        if query.get("from")
        else clock.sql_now() or datetime.now(UTC)
    )
    return views.preview(parsed, schedule_ops.preview(parsed, start, query["count"]))


class Direct(AbstractAsyncContextManager[DirectBackend]):
    """A DirectBackend on a fresh connection to a database whose schema is current."""

    def __init__(
        self, dsn: str, config: configuration.Config, clock: Clock, migrate_first: bool
    ) -> None:
        self.dsn, self.config, self.clock, self.migrate_first = dsn, config, clock, migrate_first
        self.conn: asyncpg.Connection[Any] | None = None

    async def __aenter__(self) -> DirectBackend:
        self.conn = await pools.connect(self.dsn, application_name="promptsched-cli")
        if self.migrate_first:
            await migrate.apply(self.conn)
        await migrate.check(self.conn)
        return DirectBackend(self.conn, self.dsn, self.config, self.clock)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.conn is not None:
            await self.conn.close()
