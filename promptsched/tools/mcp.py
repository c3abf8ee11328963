"""MCP servers configured on this server: one long-lived session each (a stdio command or a
streamable-HTTP URL, through the ``mcp`` SDK, imported only when a server is configured),
reconnected when it breaks, and its tools offered as ``SERVER.TOOL``."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import TaskStatus

from promptsched.tools.base import ToolError
from promptsched.tools.settings import McpSettings

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult
    from mcp.types import Tool as McpToolInfo

log = structlog.get_logger("mcp")
MAX_LIST_PAGES = 20


@dataclass(frozen=True, eq=False)
class McpTool:
    """One tool of an MCP server, as the agent loop sees it."""

    server: McpServer
    tool_name: str  # the server's own name for it
    name: str  # SERVER.TOOL
    description: str
    parameters: Mapping[str, Any]
    read_only: bool  # readOnlyHint, or vouched for by the operator (read_only = [...])
    opted_in: bool  # allow = [...]: usable although not read-only

    async def call(self, arguments: Mapping[str, Any]) -> str:
        return await self.server.call(self.tool_name, arguments)


def result_text(result: CallToolResult) -> str:
    """The text a tool result carries (non-text content named, not inlined)."""
    parts: list[str] = []
    for block in result.content:
        text = getattr(block, "text", None)
        resource = getattr(block, "resource", None)
        if isinstance(text, str):
            parts.append(text)
        elif resource is not None and isinstance(getattr(resource, "text", None), str):
            parts.append(resource.text)
        else:
            mime = getattr(block, "mime_type", None) or getattr(block, "type", "content")
            parts.append(f"[{mime} omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class McpServer:
    """Connects in ``run`` (a task that holds the session open); ``tools`` and ``error``
    describe the current state; ``call`` may be used from any task."""

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self.tools: dict[str, McpTool] = {}
        self.error: str | None = "not connected yet"
        self.attempted = anyio.Event()  # set once the first connection attempt ended
        self._client: Client | None = None
        self._broken = anyio.Event()

    def _target(self) -> Any:
        """The streamable-HTTP URL, or the stdio transport (the server's stderr goes to the
        process's own, even when ``sys.stderr`` was replaced by something without a file)."""
        from mcp import StdioServerParameters, stdio_client

        if self.settings.url is not None:
            return self.settings.url
        assert self.settings.command is not None
        program, *args = self.settings.command
        parameters = StdioServerParameters(
            command=program, args=args, env=dict(self.settings.env), cwd=self.settings.cwd
        )
        return stdio_client(parameters, errlog=sys.__stderr__ or sys.stderr)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failures = 0
        while True:
            try:
                await self._session()
                failures = 0
            except Exception as exc:  # spawn, handshake or transport: retried with backoff
                failures += 1
                self.error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("mcp.connect_failed", server=self.name, error=self.error)
            finally:
                self._client, self.tools = None, {}
                self.attempted.set()
            await anyio.sleep(min(60.0, 0.5 * 2 ** min(failures, 7)))

    async def _session(self) -> None:
        from mcp import Client

        timeout = self.settings.timeout.total_seconds()
        async with Client(self._target(), read_timeout_seconds=timeout) as client:
            self.tools = await self._list(client)
            self._client, self.error, self._broken = client, None, anyio.Event()
            self.attempted.set()
            log.info("mcp.connected", server=self.name, tools=sorted(self.tools))
            await self._broken.wait()
        self.error = "the connection broke; reconnecting"

    async def _list(self, client: Client) -> dict[str, McpTool]:
        found: dict[str, McpTool] = {}
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            for info in page.tools:
                tool = self._tool(info)
                found[tool.name] = tool
            cursor = page.next_cursor
            if cursor is None:
                break
        return found

    def _tool(self, info: McpToolInfo) -> McpTool:
        hint = info.annotations.read_only_hint if info.annotations is not None else None
        return McpTool(
            server=self,
            tool_name=info.name,
            name=f"{self.name}.{info.name}",
            description=(info.description or info.name)[:1000],
            parameters=info.input_schema,
            read_only=hint is True or info.name in self.settings.read_only,
            opted_in=info.name in self.settings.allow,
        )

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        from mcp import MCPError

        client = self._client
        if client is None:
            raise ToolError(f"MCP server {self.name!r} is not connected ({self.error})")
        timeout = self.settings.timeout.total_seconds()
        try:
            result = await client.call_tool(tool, dict(arguments), read_timeout_seconds=timeout)
        except MCPError as exc:
            raise ToolError(f"{self.name}.{tool}: {exc}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            self._broken.set()  # the session is gone: reconnect, and tell the model
            raise ToolError(f"MCP server {self.name!r} went away ({type(exc).__name__})") from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"{self.name}.{tool} reported an error")
        return text

    def close(self) -> None:
        self._broken.set()
