"""The executor protocol, the request/result types, and the provider registry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from promptsched.errors import ConfigError, Pace


@dataclass(frozen=True, slots=True)
class Step:
    """One thing an attempt did, reported as it happens (an agent run's transcript entry and
    live progress event).

    ``kind`` is ``start`` (the conversation sent), ``model`` (a reply), ``tool_call`` (a call
    about to run) or ``tool_result`` (how it ended). ``number`` is the model turn it belongs to
    (0 for ``start``), ``tokens`` the attempt's total so far, ``text`` one line for people, and
    ``detail`` the rest of the transcript entry (JSON-ready, already truncated).
    """

    kind: str
    number: int
    max_steps: int
    tokens: int
    text: str
    detail: Mapping[str, Any] = field(default_factory=dict)


Progress = Callable[[Step], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """Everything an executor may use for one attempt. Every attempt is a fresh conversation.

    ``timeout`` is the attempt's wall time in seconds (the schedule's timeout; the worker
    enforces it), ``progress`` receives the steps of a multi-step (agent) attempt.
    """

    run_id: int
    schedule_id: int
    schedule_name: str
    attempt_id: UUID
    attempt: int
    slot: datetime
    timezone: str
    prompt: str
    model: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    progress: Progress | None = None
    # the JSON Schema the answer must match (a schedule's output_schema), or None: free text
    output_schema: Mapping[str, Any] | None = None
    # a follow-up's check: {"key": ..., "vars": {...}} (docs/followups.md), None otherwise
    followup: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    output: str
    usage: Mapping[str, int] | None = None
    # the provider's structured answer, when it has one (the webhook provider's JSON body):
    # a follow-up's check reads its decision from it (executors/decision.py)
    answer: Mapping[str, Any] | None = None
    # the answer's JSON, checked against the request's output_schema (executors/structured.py)
    data: Any = None
    # what the provider's rate-limit headers said is left (executors/ratelimit.py), if nothing
    pace: Pace | None = None


class Executor(Protocol):
    """A provider. ``execute`` raises ``promptsched.errors.ExecutorError`` subclasses on failure
    and must abort promptly when cancelled (a fenced or cancelled attempt)."""

    name: str

    async def execute(self, request: ExecutionRequest) -> ExecutionResult: ...

    async def aclose(self) -> None: ...


class Registry:
    """Named executors configured on the server."""

    def __init__(self, executors: Mapping[str, Executor]) -> None:
        self._executors = dict(executors)

    def get(self, name: str) -> Executor:
        try:
            return self._executors[name]
        except KeyError:
            known = ", ".join(sorted(self._executors)) or "none"
            raise ConfigError(
                "provider", f"unknown provider {name!r} (configured: {known})"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._executors)

    async def aclose(self) -> None:
        for executor in self._executors.values():
            await executor.aclose()
