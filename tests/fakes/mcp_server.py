"""A small stdio MCP server for tests, built with the ``mcp`` SDK: run it as
``python tests/fakes/mcp_server.py``. ``lookup`` is marked read-only (readOnlyHint);
``write_note`` is not; ``broken`` is read-only and always fails."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("test-kb")
FACTS = {"capital of france": "Paris", "answer": "42"}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(key: str) -> str:
    """Look a fact up by its key."""
    return FACTS.get(key.lower(), f"no fact for {key!r}")


@server.tool()
def write_note(text: str) -> str:
    """Store a note (changes the server's state: not read-only)."""
    return f"stored {len(text)} characters"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def broken(key: str) -> str:
    """Always fails (an error result with a message for the model)."""
    raise ToolError(f"the index for {key!r} is corrupt")


if __name__ == "__main__":
    server.run()
