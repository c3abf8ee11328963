"""Answers in a schema: an attempt whose schedule has an ``output_schema`` reads its answer as
JSON and checks it; an answer that is not JSON or does not match is asked for once more with
the problem told (appended to the conversation, or sent to a webhook), and a second miss fails
the run for good, naming the failing path; a schema whose patterns take too long on an answer
fails it for good at once (monitor/patterns.py checks those off the event loop). See
docs/monitors.md."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from promptsched.errors import PermanentError, RetryableError
from promptsched.executors.base import ExecutionResult
from promptsched.monitor import patterns
from promptsched.monitor import schema as output_schema

Ask = Callable[[], Awaitable[ExecutionResult]]
AskAgain = Callable[[ExecutionResult, str], Awaitable[ExecutionResult]]


async def problem(
    schema: Mapping[str, Any], result: ExecutionResult, *, provider: str, usage: Any
) -> tuple[Any, str | None]:
    """``(data, None)`` when the answer is JSON matching ``schema``, else ``(None, why)``. A
    schema whose patterns take too long on the answer ends the attempt for good (a
    PermanentError carrying ``usage``), never the event loop's time (monitor/patterns.py)."""
    try:
        data = result.data if result.data is not None else output_schema.read_answer(result.output)
    except ValueError as exc:
        return None, str(exc)
    try:
        found = await patterns.problem(schema, data)
    except patterns.TooSlow as exc:
        raise PermanentError(f"{provider}: {exc}", usage=usage or None) from None
    except patterns.Unavailable as exc:
        raise RetryableError(f"{provider}: {exc}", usage=usage or None) from None
    return (None, f"the answer does not match the output_schema {found}") if found else (data, None)


def repair_message(why: str) -> str:
    """What the model is told before its second chance."""
    return (
        f"That answer cannot be used: {why}. Answer again with only a JSON object that "
        "matches the JSON Schema you were given, and nothing else."
    )


def instructions(schema: Mapping[str, Any]) -> str:
    """The schema in words, for a conversation whose provider cannot be given it as a
    response format (``json_object``)."""
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return f"Answer with only a JSON object that matches this JSON Schema: {text}"


def _summed(first: Mapping[str, int] | None, second: Mapping[str, int] | None) -> dict[str, int]:
    total = dict(first or {})
    for key, value in (second or {}).items():
        total[key] = total.get(key, 0) + value
    return total


async def answer(
    schema: Mapping[str, Any],
    ask: Ask,
    again: AskAgain,
    *,
    provider: str,
    cumulative: bool = False,
) -> ExecutionResult:
    """The attempt's checked answer (``data`` holds its JSON). ``again`` asks a second time,
    given the first answer and what is wrong with it. ``cumulative``: the second result's
    usage already counts the first's (an agent's running total)."""
    first = await ask()
    data, why = await problem(schema, first, provider=provider, usage=first.usage)
    if why is None:
        return dataclasses.replace(first, data=data)
    second = await again(first, why)
    usage = dict(second.usage or {}) if cumulative else _summed(first.usage, second.usage)
    data, why_again = await problem(schema, second, provider=provider, usage=usage)
    if why_again is not None:
        raise PermanentError(f"{provider}: {why_again} (asked twice)", usage=usage or None)
    return dataclasses.replace(second, data=data, usage=usage or None)
