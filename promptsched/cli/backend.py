"""The two ways a command reaches schedules and runs: directly through the database (as the
database's operator, who sees every owner) or remotely through the HTTP API (as the token's
owner). Both return the API's JSON, so each command has one rendering whichever way it went."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from promptsched import config as configuration
from promptsched.cli import common, direct, remote
from promptsched.clock import Clock


class Backend(Protocol):
    """Each method answers what the API's matching route answers (``watch``: its events)."""

    async def create_schedule(self, body: dict[str, Any], owner: str | None) -> dict[str, Any]: ...
    async def list_schedules(
        self, *, owner: str | None, name: str | None, limit: int
    ) -> list[dict[str, Any]]: ...
    async def get_schedule(self, schedule_id: int) -> dict[str, Any]: ...
    async def schedule_names(self, ids: list[int]) -> dict[int, tuple[str, str]]:
        """``{id: (name, timezone)}`` of those that exist (and are visible)."""
        ...

    async def update_schedule(
        self, schedule_id: int, patch: dict[str, Any], version: int | None
    ) -> dict[str, Any]: ...
    async def pause_schedule(
        self, schedule_id: int, until: str | None, reason: str | None
    ) -> dict[str, Any]: ...
    async def resume_schedule(self, schedule_id: int) -> dict[str, Any]: ...
    async def trigger_schedule(self, schedule_id: int) -> dict[str, Any]: ...
    async def backfill_schedule(self, schedule_id: int, start: str, end: str) -> dict[str, Any]: ...
    async def delete_schedule(self, schedule_id: int) -> None: ...
    async def schedule_history(self, schedule_id: int, limit: int) -> list[dict[str, Any]]: ...
    async def explain(self, schedule_id: int, at: str) -> dict[str, Any]: ...
    async def list_runs(
        self, *, schedule_id: int | None, status: str | None, limit: int
    ) -> list[dict[str, Any]]: ...
    async def get_run(self, run_id: int) -> dict[str, Any]: ...
    async def diff_runs(self, run_id: int, other_id: int) -> dict[str, Any]: ...
    async def cancel_run(self, run_id: int) -> dict[str, Any]: ...
    async def replay_run(self, run_id: int) -> dict[str, Any]: ...
    def watch(self, run_id: int) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...
    async def dead_notifications(self, limit: int) -> list[dict[str, Any]]: ...
    async def replay_notification(self, notification_id: int) -> dict[str, Any]: ...
    async def preview(self, query: dict[str, Any]) -> dict[str, Any]: ...
    async def get_budget(self, owner: str | None) -> dict[str, Any]: ...
    async def create_followup(
        self, body: dict[str, Any], owner: str | None
    ) -> tuple[bool, dict[str, Any]]: ...
    async def get_followup(self, key: str, owner: str | None) -> dict[str, Any]: ...
    async def cancel_followup(self, key: str, owner: str | None) -> None: ...
    async def list_followup_runs(
        self, key: str, *, status: str | None, limit: int, owner: str | None
    ) -> list[dict[str, Any]]: ...
    async def list_followups(
        self, state: str | None, limit: int, owner: str | None
    ) -> list[dict[str, Any]]: ...
    async def set_budget(self, owner: str | None, budget: dict[str, Any]) -> dict[str, Any]: ...
    async def status(self) -> dict[str, Any]: ...
    async def idle(self) -> bool:
        """No replica runs the worker role, so a pending run waits (direct mode; a service
        answering the API is a replica, so remote mode says False)."""
        ...


Action = Callable[[Backend], Awaitable[int]]


def add_remote_flags(parser: argparse.ArgumentParser) -> None:
    """``--url`` and ``--token``, accepted before or after the subcommand."""
    parser.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"the service's base URL (or {remote.URL_ENV}): go through its HTTP API",
    )
    parser.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help=f"an API token (or {remote.TOKEN_ENV}; a flag is visible to other local users)",
    )


def remote_target(args: argparse.Namespace, config: configuration.Config) -> remote.Target | None:
    return remote.target(getattr(args, "url", None), getattr(args, "token", None), config.env)


def run(
    args: argparse.Namespace,
    config: configuration.Config,
    action: Action,
    *,
    migrate_first: bool = False,
) -> int:
    """Run ``action`` against the service (remote mode) or the database (direct mode)."""
    clock: Clock = getattr(args, "clock", None) or Clock()
    where = remote_target(args, config)
    if where is not None:

        async def over_http() -> int:
            async with remote.RemoteBackend(where) as backend:
                return await action(backend)

        return common.run_async(over_http)
    with common.database(config, create=migrate_first) as dsn:

        async def over_db() -> int:
            async with direct.Direct(dsn, config, clock, migrate_first) as backend:
                return await action(backend)

        return common.run_async(over_db)
