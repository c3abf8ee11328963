"""The tool protocol every source implements, and the error a tool call ends with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from promptsched.errors import PromptschedError, ValidationError


class ToolError(PromptschedError):
    """A tool call failed; its message is what the model is told."""


class Tool(Protocol):
    """One callable tool. ``name`` is what schedules list (``http_get``, ``SERVER.TOOL``);
    ``parameters`` is the JSON schema of its arguments object; ``read_only`` says the tool
    changes nothing outside (the only kind scheduled runs use unless an operator opts a tool
    in). ``call`` returns text for the model or raises ``ToolError``."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...

    @property
    def read_only(self) -> bool: ...

    async def call(self, arguments: Mapping[str, Any]) -> str: ...


def string_argument(arguments: Mapping[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"argument {key!r} must be a non-empty string")
    return value.strip()


def int_argument(arguments: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = arguments.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ToolError(f"argument {key!r} must be a whole number")
    if not low <= value <= high:
        raise ToolError(f"argument {key!r} must be between {low} and {high}")
    return int(value)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… {len(text) - limit} more characters cut]"


@dataclass(frozen=True)
class Catalog:
    """What a server offers scheduled runs, for save-time checks: each known tool's name with
    ``None`` when runs may use it, else why not; and the MCP servers not connected now, with
    the reason (their tools cannot be listed)."""

    tools: Mapping[str, str | None]
    unavailable: Mapping[str, str] = field(default_factory=dict)

    def check(self, names: Sequence[str], field_name: str = "params.tools") -> None:
        """Raise ``ValidationError`` naming the first tool that is unknown or refused."""
        for index, name in enumerate(names):
            where = f"{field_name}[{index}]"
            if name not in self.tools:
                server = name.split(".", 1)[0] if "." in name else None
                if server is not None and server in self.unavailable:
                    raise ValidationError(
                        where,
                        f"unknown tool {name!r}: MCP server {server!r} is not connected "
                        f"({self.unavailable[server]})",
                    )
                known = ", ".join(sorted(self.tools)) or "none"
                raise ValidationError(where, f"unknown tool {name!r}; available: {known}")
            refusal = self.tools[name]
            if refusal is not None:
                raise ValidationError(where, refusal)
