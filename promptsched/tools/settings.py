"""MCP server configuration: ``[mcp.NAME]`` tables of the TOML file and the
``PROMPTSCHED_MCP_SERVERS`` variable (a JSON object of the same tables, overriding TOML
servers by name), validated once at startup; every error names the key to fix."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from promptsched.durations import parse_duration
from promptsched.errors import ConfigError, ValidationError

ENV = "PROMPTSCHED_MCP_SERVERS"
DEFAULT_TIMEOUT = timedelta(seconds=30)
KEYS = ("command", "url", "env", "cwd", "read_only", "allow", "timeout")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


@dataclass(frozen=True)
class McpSettings:
    """One MCP server: a command to start (stdio) or a streamable-HTTP URL.

    ``read_only`` lists tools the operator vouches are read-only although the server does not
    say so (no ``readOnlyHint``); ``allow`` opts in tools that are not read-only. Either makes a
    tool usable by scheduled runs. ``timeout`` bounds connecting and listing, and each call.
    """

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: str | None = None
    read_only: frozenset[str] = frozenset()
    allow: frozenset[str] = frozenset()
    timeout: timedelta = DEFAULT_TIMEOUT


def _tables(raw: Any, where: str) -> dict[str, tuple[str, Mapping[str, Any]]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(where, "must be a table of [mcp.NAME] tables")
    tables = {}
    for name, table in raw.items():
        at = f"{where}.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(at, "a server name is lowercase letters, digits, '-' or '_'")
        if not isinstance(table, Mapping):
            raise ConfigError(at, f"must be a table ({', '.join(KEYS)})")
        tables[name] = (at, table)
    return tables


def parse_mcp_servers(
    env_json: str | None, toml: Mapping[str, Any] | None = None
) -> dict[str, McpSettings]:
    """Every configured MCP server by name. ``toml`` is the config file's ``mcp`` table."""
    tables = _tables(toml, "mcp")
    if env_json and env_json.strip():
        try:
            data = json.loads(env_json)
        except ValueError as exc:
            raise ConfigError(ENV, f"must be a JSON object of servers: {exc}") from None
        tables.update(_tables(data, ENV))
    return {name: _build(name, at, table) for name, (at, table) in sorted(tables.items())}


def _build(name: str, at: str, table: Mapping[str, Any]) -> McpSettings:
    for key in table:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{at}.{key}", f"unknown setting{hint}; known: {', '.join(KEYS)}")
    command, url = table.get("command"), table.get("url")
    if (command is None) == (url is None):
        raise ConfigError(at, "give either command (a stdio server) or url (streamable HTTP)")
    return McpSettings(
        name=name,
        command=_command(command, f"{at}.command") if command is not None else None,
        url=_url(url, f"{at}.url") if url is not None else None,
        env=MappingProxyType(_strings_table(table.get("env"), f"{at}.env")),
        cwd=_text(table.get("cwd"), f"{at}.cwd"),
        read_only=frozenset(_names(table.get("read_only"), f"{at}.read_only")),
        allow=frozenset(_names(table.get("allow"), f"{at}.allow")),
        timeout=_timeout(table.get("timeout"), f"{at}.timeout"),
    )


def _command(value: Any, at: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(at, 'must be a list: the program and its arguments ["cmd", "arg"]')
    if not all(isinstance(part, str) and part for part in value):
        raise ConfigError(at, "every part must be a non-empty string")
    return tuple(value)


def _url(value: Any, at: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(at, "must be a URL string")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(at, f"not an http(s) URL: {value!r}")
    return value


def _text(value: Any, at: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(at, "must be a non-empty string")
    return value


def _strings_table(value: Any, at: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(at, "must be a table of string values")
    return dict(value)


def _names(value: Any, at: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(at, 'must be a list of tool names, e.g. ["search"]')
    return list(value)


def _timeout(value: Any, at: str) -> timedelta:
    if value is None:
        return DEFAULT_TIMEOUT
    try:
        parsed = parse_duration(str(value), field=at)
    except ValidationError as exc:
        raise ConfigError(at, exc.message) from None
    if parsed <= timedelta(0):
        raise ConfigError(at, "must be positive")
    return parsed
