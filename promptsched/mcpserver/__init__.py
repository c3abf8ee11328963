"""promptsched as an MCP server: the tools and resources an assistant uses to schedule prompts
and keyed follow-ups, over stdio (``promptsched mcp``) and Streamable HTTP (``/mcp`` on the
service), each answered by the API's own operations for the token's owner (docs/mcp.md)."""
