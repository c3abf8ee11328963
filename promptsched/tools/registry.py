"""The tools this server offers scheduled runs: the built-ins plus the configured MCP
servers' tools, and the rule that only read-only tools (or ones an operator opted in) may be
used. ``catalog`` serves save-time checks; ``resolve`` gives a run its tools."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
from anyio.abc import TaskStatus

from promptsched import netguard
from promptsched.errors import RetryableError
from promptsched.tools.base import Catalog, Tool
from promptsched.tools.builtin import Builtins
from promptsched.tools.mcp import McpServer, McpTool
from promptsched.tools.settings import McpSettings

FIELD = "params.tools"


def refusal(tool: Tool) -> str | None:
    """Why scheduled runs may not use ``tool``, or None when they may."""
    if tool.read_only or (isinstance(tool, McpTool) and tool.opted_in):
        return None
    server, _, own = tool.name.partition(".")
    return (
        f"tool {tool.name!r} is not marked read-only (MCP readOnlyHint), so scheduled runs may "
        f"not use it; an operator can opt it in with allow = [{own!r}] under [mcp.{server}]"
    )


class ToolRegistry:
    def __init__(self, builtins: Builtins, servers: Sequence[McpServer] = ()) -> None:
        self.builtins = builtins
        self.servers = {server.name: server for server in servers}

    @classmethod
    def from_settings(
        cls, *, allow: netguard.Allowlist, mcp: Mapping[str, McpSettings] | None = None
    ) -> ToolRegistry:
        servers = [McpServer(settings) for settings in (mcp or {}).values()]
        return cls(Builtins(allow=allow), servers)

    def tools(self) -> dict[str, Tool]:
        """Every tool known now (MCP tools only while their server is connected)."""
        found: dict[str, Tool] = dict(self.builtins.tools)
        for server in self.servers.values():
            found.update(server.tools)
        return found

    def catalog(self) -> Catalog:
        unavailable = {
            name: server.error or "not connected"
            for name, server in self.servers.items()
            if server.error is not None
        }
        tools = {name: refusal(tool) for name, tool in self.tools().items()}
        return Catalog(tools, unavailable)

    def resolve(self, names: Sequence[str]) -> list[Tool]:
        """The tools a run asked for. ``ValidationError`` for an unknown or refused tool (the
        run cannot succeed); ``RetryableError`` when its MCP server is not connected now."""
        known = self.tools()
        catalog = self.catalog()
        resolved: list[Tool] = []
        for name in names:
            server = self.servers.get(name.split(".", 1)[0]) if "." in name else None
            if name not in known and server is not None and server.error is not None:
                raise RetryableError(
                    f"agent: MCP server {server.name!r} is not connected ({server.error})"
                )
            catalog.check([name], FIELD)
            resolved.append(known[name])
        return resolved

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect every MCP server (reconnecting as needed); ready once each has made its
        first attempt (bounded by its timeout), so save-time checks see its tools."""
        async with anyio.create_task_group() as tg:
            for server in self.servers.values():
                await tg.start(server.run)
            for server in self.servers.values():
                with anyio.move_on_after(server.settings.timeout.total_seconds() + 5):
                    await server.attempted.wait()
            task_status.started()

    async def aclose(self) -> None:
        await self.builtins.aclose()


async def discover(registry: ToolRegistry) -> Catalog:
    """The catalog after one connection attempt to each MCP server, for one-shot commands."""
    async with anyio.create_task_group() as tg:
        await tg.start(registry.run)
        catalog = registry.catalog()
        tg.cancel_scope.cancel()
    await registry.aclose()
    return catalog
