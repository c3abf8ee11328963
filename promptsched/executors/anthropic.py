"""The ``anthropic`` provider: Anthropic's Messages API, ``POST {base_url}/v1/messages`` with the
key in ``x-api-key`` and the ``anthropic-version`` header (docs/providers.md).

The schedule's ``system`` param is the request's ``system``, the rendered prompt the user
message; the output is the reply's text blocks joined, ``stop_reason`` its finish reason, and
its usage (``input_tokens``, ``output_tokens``, the cache tokens) the run's. An answer in a
schema comes through one tool whose input schema is the schedule's ``output_schema``, forced
with ``tool_choice``; an agent run's tools are Anthropic tools, and with a schema too the answer
tool is one of them and ``tool_choice`` ``any`` makes the model end with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from promptsched.executors import agent, chat, http_client, structured
from promptsched.executors.settings import DEFAULT_ANTHROPIC_VERSION, ProviderSettings

__all__ = ["DEFAULT_ANTHROPIC_VERSION", "AnthropicExecutor", "generation_params"]
from promptsched.monitor import schema as output_schema

# Anthropic requires max_tokens; a schedule sets its own with --param max_tokens=N.
DEFAULT_MAX_TOKENS = 4096
# The private param that carries the answer tool of an output_schema (never sent as is).
ANSWER_TOOL = "_answer_tool"
ANSWER_DESCRIPTION = (
    "Give your final answer by calling this tool: its input is the answer, in the JSON Schema "
    "given."
)

GENERATION_PARAMS: Mapping[str, Callable[[Any], Any]] = {
    "max_tokens": chat.positive,
    "temperature": chat.between(0, 1),
    "top_p": chat.between(0, 1),
    "top_k": chat.positive,
    "stop": chat.stop,  # sent as stop_sequences
}

# 529 "overloaded" and 503 are Anthropic saying "not now", with or without retry-after.
PUSHBACK = http_client.Pushback(throttled=frozenset({503, 529}))


def generation_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The request's generation fields (``max_tokens`` defaulted, ``stop`` as
    ``stop_sequences``); ``ValidationError`` naming ``params.KEY`` otherwise."""
    body = chat.convert_params(params, GENERATION_PARAMS)
    stop = body.pop("stop", None)
    if stop is not None:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    body.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    return body


def validate_params(params: Mapping[str, Any]) -> None:
    generation_params(params)


def usage_of(raw: Any) -> dict[str, int]:
    """The run's usage from the reply's: prompt tokens are every input token (uncached, written
    to the cache and read from it, as Anthropic counts them apart), completion tokens the
    output ones; the two cache counts are kept as reported when present."""
    counts = chat.usage_counts(raw)
    if not counts:
        return {}
    written = counts.get("cache_creation_input_tokens", 0)
    read = counts.get("cache_read_input_tokens", 0)
    prompt = counts.get("input_tokens", 0) + written + read
    completion = counts.get("output_tokens", 0)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion}  # fmt: skip
    for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        if key in counts:
            usage[key] = counts[key]
    return usage


def _tool(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic tool from the tool loop's function spec (OpenAI's shape)."""
    function = spec.get("function") or {}
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "name": function.get("name"),
        "description": function.get("description") or "",
        "input_schema": schema,
    }


def _answer_name(params: Mapping[str, Any]) -> str:
    """The answer tool's name, unlike any of the agent's tools."""
    answer = params[ANSWER_TOOL]
    taken = {(spec.get("function") or {}).get("name") for spec in params.get("tools") or []}
    name = str(answer["name"])
    while name in taken:
        name = f"{name[:60]}_"
    return name


def _arguments(call: Mapping[str, Any]) -> Any:
    raw = (call.get("function") or {}).get("arguments")
    if not isinstance(raw, str):
        return raw if isinstance(raw, dict) else {}
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": value}


def _add(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Append ``blocks`` as a turn of ``role``, joined to the last turn when it is that
    role's already (Anthropic alternates user and assistant turns)."""
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": blocks})


def conversation(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The request's ``system`` text and ``messages`` from the conversation."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "system":
            system.append(str(content))
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
                      "content": str(content)}  # fmt: skip
            _add(turns, "user", [result])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if content:
                blocks.append({"type": "text", "text": str(content)})
            for call in message.get("tool_calls") or []:
                blocks.append({"type": "tool_use", "id": call.get("id"),
                               "name": (call.get("function") or {}).get("name"),
                               "input": _arguments(call)})  # fmt: skip
            _add(turns, "assistant", blocks)
        else:
            _add(turns, "user", [{"type": "text", "text": str(content)}])
    return "\n\n".join(system), turns


class AnthropicExecutor(chat.ChatExecutor):
    """POSTs ``{base_url}/v1/messages``."""

    pushback = PUSHBACK
    models_path = "/v1/models"

    def url(self, model: str) -> str:
        return f"{self._base_url}/v1/messages"

    @staticmethod
    def headers(settings: ProviderSettings) -> dict[str, str]:
        version = settings.api_version or DEFAULT_ANTHROPIC_VERSION
        return {
            "anthropic-version": version,
            **http_client.request_headers(
                settings.headers, settings.api_key, key_header="x-api-key"
            ),
        }

    @staticmethod
    def generation_params(params: Mapping[str, Any]) -> dict[str, Any]:
        return generation_params(params)

    def ask_in_schema(
        self,
        schema: Mapping[str, Any],
        params: dict[str, Any],
        messages: list[dict[str, Any]],
        *,
        agent_run: bool,
    ) -> dict[str, Any]:
        if self._settings.structured_output == "json_object":  # the schema in words only
            messages.insert(0, {"role": "system", "content": structured.instructions(schema)})
            return params
        tool = {
            "name": output_schema.response_name(schema),
            "description": ANSWER_DESCRIPTION,
            "input_schema": dict(schema),
        }
        return {**params, ANSWER_TOOL: tool}

    def payload(
        self, messages: Sequence[Mapping[str, Any]], model: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        body = {key: value for key, value in params.items() if key not in ("tools", ANSWER_TOOL)}
        system, turns = conversation(messages)
        body["model"] = model
        body["messages"] = turns
        if system:
            body["system"] = system
        tools = [_tool(spec) for spec in params.get("tools") or []]
        if ANSWER_TOOL in params:
            name = _answer_name(params)
            # Alone, the answer tool is forced; among the agent's tools, some tool must be
            # called at every turn, and the answer tool ends the run.
            body["tool_choice"] = {"type": "any"} if tools else {"type": "tool", "name": name}
            tools.append({**params[ANSWER_TOOL], "name": name})
        if tools:
            body["tools"] = tools
        return body

    def read(self, data: Any, params: Mapping[str, Any]) -> agent.ChatReply:
        provider = self.name
        if not isinstance(data, dict):
            raise http_client.invalid_response(provider, "expected a JSON object")
        content = data.get("content")
        if not isinstance(content, list):
            error = http_client.body_excerpt(json.dumps(data)) if "error" in data else "no content"
            raise http_client.invalid_response(provider, error)
        answer_name = _answer_name(params) if ANSWER_TOOL in params else None
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        answer: Any = None
        for index, block in enumerate(content):
            if not isinstance(block, dict):
                raise http_client.invalid_response(provider, f"content[{index}] is not an object")
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "tool_use":
                name, given = block.get("name"), block.get("input")
                if not isinstance(name, str):
                    raise http_client.invalid_response(provider, f"content[{index}] has no name")
                if name == answer_name:
                    answer = given if given is not None else {}
                    continue
                call_id = block.get("id")
                calls.append({
                    "id": call_id if isinstance(call_id, str) and call_id else f"toolu_{index}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(given or {})},
                })  # fmt: skip
        stop_reason = data.get("stop_reason")
        text: str | None = "".join(texts) if texts else None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if answer is not None:  # the answer tool's input is the answer, whatever else came
            message["content"] = json.dumps(answer, ensure_ascii=False)
        elif stop_reason == "refusal":
            message["content"] = None
            message["refusal"] = text or "stop_reason refusal"
        elif calls:
            message["tool_calls"] = calls
        return agent.ChatReply(
            message=message,
            content=message["content"],
            finish_reason=stop_reason if isinstance(stop_reason, str) else None,
            usage=usage_of(data.get("usage")),
        )
