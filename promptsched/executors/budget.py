"""An agent run's per-schedule params: the tools it may call and its budgets (model steps,
total tokens, time per tool call; its wall time is the schedule's timeout). Parsed the same
way when a schedule is saved and when an attempt starts, every error naming ``params.KEY``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from promptsched.durations import format_duration, parse_duration
from promptsched.errors import ValidationError
from promptsched.tools.base import Catalog

TOOLS, MAX_STEPS, MAX_TOKENS_TOTAL, TOOL_TIMEOUT = (
    "tools", "max_steps", "max_tokens_total", "tool_timeout",
)  # fmt: skip
AGENT_PARAMS = (TOOLS, MAX_STEPS, MAX_TOKENS_TOTAL, TOOL_TIMEOUT)
DEFAULT_MAX_STEPS = 8
STEPS_LIMIT = 50
TOOLS_LIMIT = 32
DEFAULT_TOOL_TIMEOUT = timedelta(seconds=30)
TOOL_TIMEOUT_RANGE = (timedelta(milliseconds=100), timedelta(minutes=10))


@dataclass(frozen=True, slots=True)
class Budget:
    tools: tuple[str, ...]
    max_steps: int = DEFAULT_MAX_STEPS
    max_tokens_total: int | None = None
    tool_timeout: timedelta = DEFAULT_TOOL_TIMEOUT


def is_agent_run(params: Mapping[str, Any]) -> bool:
    """An openai schedule with any agent param runs the tool loop (and keeps a transcript)."""
    return any(key in params for key in AGENT_PARAMS)


def _tools(value: Any) -> tuple[str, ...]:
    field = f"params.{TOOLS}"
    if isinstance(value, str):  # the CLI's --param tools=http_get,rss
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        raise ValidationError(field, 'must be a list of tool names, e.g. ["http_get"]')
    if len(value) > TOOLS_LIMIT:
        raise ValidationError(field, f"at most {TOOLS_LIMIT} tools, got {len(value)}")
    names: list[str] = []
    for index, name in enumerate(value):
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ValidationError(f"{field}[{index}]", "must be a tool name")
        if name.strip() in names:
            raise ValidationError(f"{field}[{index}]", f"{name!r} is listed twice")
        names.append(name.strip())
    return tuple(names)


def _whole(params: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not number.is_integer():
        raise ValidationError(f"params.{key}", f"must be a whole number, got {value!r}")
    if not low <= number <= high:
        raise ValidationError(f"params.{key}", f"must be between {low} and {high}, got {value}")
    return int(number)


def _tool_timeout(params: Mapping[str, Any]) -> timedelta:
    value = params.get(TOOL_TIMEOUT)
    if value is None:
        return DEFAULT_TOOL_TIMEOUT
    field = f"params.{TOOL_TIMEOUT}"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValidationError(field, "must be a duration such as 30s")
    timeout = parse_duration(str(value), field=field)
    low, high = TOOL_TIMEOUT_RANGE
    if not low <= timeout <= high:
        raise ValidationError(
            field, f"must be between {format_duration(low)} and {format_duration(high)}"
        )
    return timeout


def parse(params: Mapping[str, Any]) -> Budget:
    """The budget a schedule's params set; ``ValidationError`` names the bad param."""
    return Budget(
        tools=_tools(params.get(TOOLS, [])),
        max_steps=_whole(params, MAX_STEPS, 1, STEPS_LIMIT) or DEFAULT_MAX_STEPS,
        max_tokens_total=_whole(params, MAX_TOKENS_TOTAL, 1, 10**9),
        tool_timeout=_tool_timeout(params),
    )


def validate(params: Mapping[str, Any], catalog: Catalog | None) -> None:
    """Save-time check: the budget parses and, with a ``catalog``, every tool exists on this
    server and scheduled runs may use it."""
    budget = parse(params)
    if catalog is not None:
        catalog.check(list(budget.tools), f"params.{TOOLS}")
