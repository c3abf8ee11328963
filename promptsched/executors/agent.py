"""The agent loop of the LLM-API providers (``chat.py``: ``openai``, ``anthropic``,
``gemini``): model, tool calls, tool results, model, until the model answers, within the
schedule's budgets. Every attempt starts from the fresh conversation it is given; tools are
read-only; each step is reported as it happens so the worker can keep a transcript and
publish progress. Running out of a budget is permanent:
another attempt would run out again."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import anyio
import structlog

from promptsched import storable
from promptsched.durations import format_duration
from promptsched.errors import Pace, PermanentError, ValidationError
from promptsched.executors import budget as budgets
from promptsched.executors import http_client, structured
from promptsched.executors.base import ExecutionRequest, ExecutionResult, Step
from promptsched.tools.base import Tool, ToolError, clip

log = structlog.get_logger("agent")

MODEL_RESULT_CHARS = 16_000  # a tool result as the model sees it
TRANSCRIPT_CHARS = 2_000  # a text as the transcript keeps it
_FUNCTION_NAME = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class ChatReply:
    """``choices[0]`` of one chat completion: the assistant message as sent (it may carry
    ``tool_calls``), its text content, why it stopped, and the token usage."""

    message: Mapping[str, Any]
    content: str | None
    finish_reason: str | None
    usage: dict[str, int]
    pace: Pace | None = None  # what its rate-limit headers said is left (ratelimit.py)


class Chat(Protocol):
    def __call__(
        self, messages: Sequence[Mapping[str, Any]], *, model: str, params: Mapping[str, Any]
    ) -> Awaitable[ChatReply]: ...


class ToolSource(Protocol):
    def resolve(self, names: Sequence[str]) -> list[Tool]: ...


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    function: str
    arguments: Any  # the JSON text the model sent (or an object, from lenient servers)

    def parsed(self) -> Mapping[str, Any]:
        value = self.arguments
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError as exc:
                raise ToolError(f"the arguments are not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise ToolError("the arguments must be a JSON object")
        return value


def answer_text(reply: ChatReply, provider: str) -> str:
    """The final answer of a reply: its content, or why there is none."""
    if reply.content is not None:
        return reply.content
    refusal = reply.message.get("refusal")
    if isinstance(refusal, str) and refusal:
        raise PermanentError(f"{provider}: the model refused: {refusal[:300]}")
    raise http_client.invalid_response(provider, "the reply has no text content")


def tool_calls(reply: ChatReply, provider: str) -> list[ToolCall]:
    raw = reply.message.get("tool_calls") or []
    if not isinstance(raw, list):
        raise http_client.invalid_response(provider, "tool_calls is not a list")
    calls = []
    for index, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise http_client.invalid_response(
                provider, f"tool_calls[{index}] has no function name"
            )
        assert isinstance(function, dict) and isinstance(item, dict)
        call_id = item.get("id")
        calls.append(
            ToolCall(
                call_id if isinstance(call_id, str) and call_id else f"call_{index}",
                name,
                function.get("arguments", "{}"),
            )
        )
    return calls


def function_names(tools: Sequence[Tool]) -> dict[str, Tool]:
    """The name the model calls each tool by: OpenAI function names allow only letters,
    digits, ``_`` and ``-`` (``kb.search`` becomes ``kb__search``), unique, at most 64."""
    named: dict[str, Tool] = {}
    for tool in tools:
        base = _FUNCTION_NAME.sub("_", tool.name.replace(".", "__"))[:60] or "tool"
        name, suffix = base, 2
        while name in named:
            name, suffix = f"{base}_{suffix}", suffix + 1
        named[name] = tool
    return named


def _tokens(usage: Mapping[str, int]) -> int:
    total = usage.get("total_tokens")
    if total is not None:
        return total
    return usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)


def _margin(wall: float) -> float:
    # Stop just before the worker's own timeout fires, so the error says which budget ran out.
    return min(1.0, 0.1 * wall)


async def run(
    chat: Chat,
    request: ExecutionRequest,
    *,
    provider: str,
    model: str,
    params: Mapping[str, Any],
    messages: list[dict[str, Any]],
    tools: ToolSource | None,
) -> ExecutionResult:
    """One attempt of an agent run, from ``messages`` (a fresh conversation)."""
    try:
        budget = budgets.parse(request.params)
        resolved = tools.resolve(budget.tools) if tools is not None and budget.tools else []
    except ValidationError as exc:
        raise PermanentError(f"agent: {exc}") from None
    if budget.tools and tools is None:
        raise PermanentError("agent: this server has no tools configured")
    loop = Loop(chat, request, provider, model, params, budget, resolved)
    wall = request.timeout
    if wall is None:
        return await _answer(loop, messages, request, provider)
    with anyio.move_on_after(max(0.0, wall - _margin(wall))):
        return await _answer(loop, messages, request, provider)
    limit = format_duration(timedelta(seconds=wall))
    raise PermanentError(f"agent: time budget of {limit} exceeded (the schedule's timeout)")


async def ask_again(
    messages: list[dict[str, Any]],
    first: ExecutionResult,
    why: str,
    ask: Callable[[], Awaitable[ExecutionResult]],
) -> ExecutionResult:
    """The second chance of an answer outside its schema: the answer and what is wrong with it
    join the conversation, and the model is asked again."""
    messages.append({"role": "assistant", "content": first.output})
    messages.append({"role": "user", "content": structured.repair_message(why)})
    return await ask()


async def _answer(
    loop: Loop, messages: list[dict[str, Any]], request: ExecutionRequest, provider: str
) -> ExecutionResult:
    schema = request.output_schema
    if schema is None:
        return await loop.run(messages)

    async def ask() -> ExecutionResult:
        return await loop.run(messages)

    return await structured.answer(
        schema, ask, lambda first, why: ask_again(messages, first, why, ask),
        provider=provider, cumulative=True,
    )  # fmt: skip


class Loop:
    """The state of one attempt's conversation: tools by function name, tokens used."""

    def __init__(
        self,
        chat: Chat,
        request: ExecutionRequest,
        provider: str,
        model: str,
        params: Mapping[str, Any],
        budget: budgets.Budget,
        tools: Sequence[Tool],
    ) -> None:
        self.chat = chat
        self.request = request
        self.provider = provider
        self.model = model
        self.budget = budget
        self.functions = function_names(tools)
        specs = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": tool.description,
                    "parameters": dict(tool.parameters),
                },
            }
            for name, tool in self.functions.items()
        ]
        self.params = {**params, "tools": specs} if specs else dict(params)
        self.tokens = 0
        self.usage: dict[str, int] = {}
        self.calls = 0

    async def report(self, kind: str, number: int, text: str, **detail: Any) -> None:
        if self.request.progress is not None:
            step = Step(kind, number, self.budget.max_steps, self.tokens, text, detail)
            await self.request.progress(step)

    async def run(self, messages: list[dict[str, Any]]) -> ExecutionResult:
        names = [tool.name for tool in self.functions.values()]
        await self.report(
            "start", 0,
            f"starting with {', '.join(names) or 'no tools'}; at most {self.budget.max_steps} "
            "steps",
            messages=[{**m, "content": clip(str(m["content"]), TRANSCRIPT_CHARS)}
                      for m in messages],
            tools=names, model=self.model,
        )  # fmt: skip
        for number in range(1, self.budget.max_steps + 1):
            reply, calls = await self.ask(messages, number)
            if not calls:
                self.usage.update(steps=number, tool_calls=self.calls)
                return ExecutionResult(answer_text(reply, self.provider), usage=self.usage)
            if number == self.budget.max_steps:
                raise PermanentError(
                    f"agent: step budget of {self.budget.max_steps} exceeded (the model still "
                    "asked for tools at the last step)"
                )
            messages.append(
                {"role": "assistant", "content": reply.content,
                 "tool_calls": reply.message.get("tool_calls")}
            )  # fmt: skip
            for call in calls:
                messages.append(await self.call_tool(call, number))
        raise AssertionError("unreachable: the last step answers or fails")

    async def ask(
        self, messages: Sequence[Mapping[str, Any]], number: int
    ) -> tuple[ChatReply, list[ToolCall]]:
        started = anyio.current_time()
        reply = await self.chat(messages, model=self.model, params=self.params)
        calls = tool_calls(reply, self.provider)
        self.tokens += _tokens(reply.usage)
        for key, value in reply.usage.items():
            self.usage[key] = self.usage.get(key, 0) + value
        of = f"step {number}/{self.budget.max_steps}"
        wanted = ", ".join(dict.fromkeys(self._tool_name(c.function) for c in calls))
        await self.report(
            "model", number,
            f"{of}: the model calls {wanted}" if calls else f"{of}: the model answered",
            content=clip(reply.content, TRANSCRIPT_CHARS) if reply.content else reply.content,
            tool_calls=[{"id": c.id, "tool": self._tool_name(c.function),
                         "arguments": clip(str(c.arguments), TRANSCRIPT_CHARS)} for c in calls],
            finish_reason=reply.finish_reason, usage=reply.usage,
            ms=round((anyio.current_time() - started) * 1000),
        )  # fmt: skip
        limit = self.budget.max_tokens_total
        if limit is not None and self.tokens > limit:
            raise PermanentError(
                f"agent: token budget of {limit} exceeded ({self.tokens} tokens used)"
            )
        return reply, calls

    def _tool_name(self, function: str) -> str:
        tool = self.functions.get(function)
        return tool.name if tool is not None else function

    async def call_tool(self, call: ToolCall, number: int) -> dict[str, Any]:
        self.calls += 1
        name = self._tool_name(call.function)
        preview = " ".join(str(call.arguments).split())[:120]
        await self.report(
            "tool_call", number, f"calling {name} {preview}",
            call_id=call.id, tool=name, arguments=clip(str(call.arguments), TRANSCRIPT_CHARS),
        )  # fmt: skip
        started = anyio.current_time()
        result, failed = await self._invoke(call)
        result = storable.clean(result)  # a tool's text enters here (a page, an MCP server)
        ms = round((anyio.current_time() - started) * 1000)
        await self.report(
            "tool_result", number,
            f"{name} failed: {result[:120]}" if failed else f"{name} returned {len(result)} chars",
            call_id=call.id, tool=name, result=clip(result, TRANSCRIPT_CHARS), error=failed,
            chars=len(result), ms=ms,
        )  # fmt: skip
        content = clip(f"error: {result}" if failed else result, MODEL_RESULT_CHARS)
        return {"role": "tool", "tool_call_id": call.id, "content": content}

    async def _invoke(self, call: ToolCall) -> tuple[str, bool]:
        """The tool's text, or the error the model is told (the run goes on)."""
        tool = self.functions.get(call.function)
        timeout = self.budget.tool_timeout.total_seconds()
        try:
            if tool is None:
                known = ", ".join(self.functions) or "none"
                raise ToolError(f"there is no tool {call.function!r} (available: {known})")
            arguments = call.parsed()
            with anyio.move_on_after(timeout):
                return await tool.call(arguments), False
            limit = format_duration(self.budget.tool_timeout)
            return f"the tool call timed out after {limit}", True
        except ToolError as exc:
            return str(exc), True
        except Exception as exc:  # a tool's bug is the model's problem to route around
            log.warning("agent.tool_crashed", tool=call.function, error=repr(exc))
            return f"the tool failed: {type(exc).__name__}: {exc}", True
