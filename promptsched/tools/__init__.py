"""Read-only tools an agent run may call: built-ins (http_get, rss) and MCP servers' tools."""
