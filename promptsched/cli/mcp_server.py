"""``promptsched mcp``: promptsched's tools for an assistant, over MCP on stdin and stdout.
Through a service's API with a token (as the token's owner, exactly as ``/v1`` and ``/mcp``
answer it), or directly on the database as its operator, like the direct CLI."""

from __future__ import annotations

import argparse
from typing import Any

from promptsched import config as configuration
from promptsched.cli import backend, common
from promptsched.clock import Clock
from promptsched.mcpserver import server
from promptsched.mcpserver.gateway import InProcess, OverHttp
from promptsched.metrics import Metrics
from promptsched.ops import fleet
from promptsched.store import migrate
from promptsched.store import pool as pools
from promptsched.web import auth
from promptsched.web.deps import Deps

DESCRIPTION = (
    "Serve promptsched to an assistant (Claude Desktop or Code, an IDE, an agent framework) as "
    "an MCP server on stdin and stdout: tools to preview expressions, create and change "
    "schedules, place and cancel keyed follow-ups, read runs and their outputs. With "
    "PROMPTSCHED_URL and PROMPTSCHED_TOKEN (or --url/--token) it goes through the service's API "
    "as the token's owner; without them, directly to the database as its operator, who sees "
    "every owner and creates as --owner. See docs/mcp.md."
)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "mcp", help="serve promptsched's tools to an assistant over MCP (stdio)",
        description=DESCRIPTION,
    )  # fmt: skip
    parser.add_argument(
        "--owner",
        default="default",
        help="direct mode: whose the new schedules and follow-ups are (default: default)",
    )
    parser.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace, config: configuration.Config) -> int:
    where = backend.remote_target(args, config)
    if where is not None:

        async def over_http() -> int:
            async with OverHttp(where.url, where.token) as gateway:
                await server.serve_stdio(gateway, version=fleet.VERSION)
            return 0

        return common.run_async(over_http)
    owner = auth.check_owner(args.owner, "--owner")
    clock: Clock = getattr(args, "clock", None) or Clock()
    with common.database(config) as dsn:

        async def over_db() -> int:
            pool = await pools.create_pool(
                dsn, min_size=1, max_size=4, application_name="promptsched-mcp",
                statement_cache_size=0,
            )  # fmt: skip
            try:
                async with pool.acquire() as conn:
                    await migrate.check(conn)
                deps = direct_deps(pool, config, clock)
                operator = auth.Principal(token_id=0, owner=owner, admin=True)
                await server.serve_stdio(InProcess(deps, operator), version=fleet.VERSION)
            finally:
                await pool.close()
            return 0

        return common.run_async(over_db)


def direct_deps(pool: Any, config: configuration.Config, clock: Clock) -> Deps:
    """What the API's operations need, for this shell's configuration: input is checked
    against the running fleet's, or this environment's when no replica runs (as the direct
    CLI checks it)."""
    local = fleet.local(config)
    document = fleet.bare_document(local.providers, config.webhook_allow)
    return Deps(
        pool=pool,
        clock=clock,
        metrics=Metrics(),
        ready=lambda: True,
        providers=tuple(local.providers),
        provider_kinds=dict(local.providers),
        webhook_allow=config.webhook_allow,
        published=lambda: document,
    )
