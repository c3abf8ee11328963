"""The ``openai`` provider: a chat completion from any OpenAI-compatible endpoint."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from promptsched.errors import ExecutorError, PermanentError, ValidationError
from promptsched.executors import agent, http_client, http_pool, ratelimit, structured
from promptsched.executors import budget as budgets
from promptsched.executors.base import ExecutionRequest, ExecutionResult
from promptsched.executors.settings import ProviderSettings, StructuredOutput
from promptsched.monitor import schema as output_schema

SYSTEM_PARAM = "system"


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("must be a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(number):
        raise ValueError("must be a finite number")
    return number


def _between(low: float, high: float) -> Callable[[Any], float]:
    """A number in [low, high], the range the OpenAI API documents for the parameter."""

    def convert(value: Any) -> float:
        number = _number(value)
        if not low <= number <= high:
            raise ValueError(f"must be between {low:g} and {high:g}")
        return number

    return convert


def _whole(value: Any) -> int:
    number = _number(value)
    if not number.is_integer():
        raise ValueError("must be a whole number")
    if abs(number) >= 2**63:
        raise ValueError("is too large")
    return int(number)


def _positive(value: Any) -> int:
    number = _whole(value)
    if number < 1:
        raise ValueError("must be at least 1")
    return number


def _stop(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return list(value)
    raise ValueError("must be a string or a list of strings")


RESPONSE_FORMATS = ("text", "json_object", "json_schema")
_FORMAT_HELP = 'must be "text", "json_object" or {"type": "json_schema", "json_schema": {...}}'


def _response_format(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.lstrip().startswith("{") else {"type": value}
        except (ValueError, RecursionError):
            raise ValueError(f"{_FORMAT_HELP}; the text is not a JSON object") from None
    if not isinstance(value, Mapping) or value.get("type") not in RESPONSE_FORMATS:
        raise ValueError(_FORMAT_HELP)
    if value["type"] == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, Mapping) or not isinstance(inner.get("name"), str):
            raise ValueError('a "json_schema" format needs "json_schema": {"name": ..., ...}')
    return dict(value)


# The generation parameters a schedule may set, and how a CLI string becomes the wire type.
GENERATION_PARAMS: Mapping[str, Callable[[Any], Any]] = {
    "temperature": _between(0, 2),
    "top_p": _between(0, 1),
    "presence_penalty": _between(-2, 2),
    "frequency_penalty": _between(-2, 2),
    "max_tokens": _positive,
    "max_completion_tokens": _positive,
    "seed": _whole,
    "stop": _stop,
    "response_format": _response_format,
}


def generation_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The request body's generation fields from a schedule's params (``system`` excluded).

    Raises ``ValidationError`` naming ``params.KEY`` for an unknown key or a bad value, so the
    API can reject it when the schedule is saved. The agent params (``tools``, budgets) are
    the tool loop's (``budget.py``), not the request's.
    """
    body: dict[str, Any] = {}
    for key, value in params.items():
        if key == SYSTEM_PARAM:
            if not isinstance(value, str):
                raise ValidationError(f"params.{key}", "must be a string")
            continue
        if key in budgets.AGENT_PARAMS:
            continue
        convert = GENERATION_PARAMS.get(key)
        if convert is None:
            known = ", ".join([SYSTEM_PARAM, *GENERATION_PARAMS, *budgets.AGENT_PARAMS])
            raise ValidationError(f"params.{key}", f"unknown parameter; known: {known}")
        try:
            body[key] = convert(value)
        except ValueError as exc:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise ValidationError(f"params.{key}", f"{exc} (got {shown})") from None
    return body


def validate_params(params: Mapping[str, Any]) -> None:
    """Raise ``ValidationError`` if the params would be rejected at run time."""
    generation_params(params)


def response_format(schema: Mapping[str, Any], mode: StructuredOutput) -> dict[str, Any]:
    """How the request asks for an answer in ``schema`` (OpenAI's structured outputs):
    ``json_schema``, strict when the provider allows it (``strict``) and the schema is one
    strict mode accepts, or the ``json_object`` fallback."""
    if mode == "json_object":
        return {"type": "json_object"}
    strict = mode == "strict" and output_schema.strict_compatible(schema)
    return {
        "type": "json_schema",
        "json_schema": {
            "name": output_schema.response_name(schema),
            "schema": dict(schema),
            "strict": strict,
        },
    }


def build_messages(prompt: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A fresh conversation: the optional system prompt, then the rendered prompt."""
    messages: list[dict[str, Any]] = []
    system = params.get(SYSTEM_PARAM)
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    return messages


def parse_chat_reply(data: Any, provider: str) -> agent.ChatReply:
    """Read a chat-completion body; anything unexpected is a permanent invalid response."""
    if not isinstance(data, dict):
        raise http_client.invalid_response(provider, "expected a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        error = http_client.body_excerpt(json.dumps(data)) if "error" in data else "no choices"
        raise http_client.invalid_response(provider, error)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise http_client.invalid_response(provider, "choices[0].message is missing")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise http_client.invalid_response(provider, "choices[0].message.content is not a string")
    usage = data.get("usage")
    finish_reason = choices[0].get("finish_reason")
    return agent.ChatReply(
        message=message,
        content=content,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        usage={
            key: value
            for key, value in (usage.items() if isinstance(usage, dict) else ())
            if isinstance(value, int) and not isinstance(value, bool)
        },
    )


class OpenAIExecutor:
    """POSTs ``{base_url}/chat/completions``; one ``aiohttp`` session per provider, opened on
    first use and closed by ``aclose``. Errors never contain the API key."""

    def __init__(self, settings: ProviderSettings, tools: agent.ToolSource | None = None) -> None:
        if not settings.base_url:
            raise ValueError(f"provider {settings.name!r} has no base_url")
        self.name = settings.name
        self._settings = settings
        self._tools = tools
        self._url = f"{settings.base_url.rstrip('/')}/chat/completions"
        self._http = http_pool.LazySession(
            connect_timeout=settings.connect_timeout.total_seconds(),
            max_concurrency=settings.max_concurrency,
        )

    async def chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        params: Mapping[str, Any],
    ) -> agent.ChatReply:
        """One chat-completion request. ``params`` are wire-ready generation fields (see
        ``generation_params``). A tool-calling loop calls this once per turn."""
        payload = {**params, "model": model, "messages": list(messages)}
        settings = self._settings
        try:
            reply = await http_client.post_json(
                self._http,
                self._url,
                payload,
                headers=http_client.request_headers(settings.headers, settings.api_key),
                provider=self.name,
                request_timeout=settings.request_timeout.total_seconds(),
                connect_timeout=settings.connect_timeout.total_seconds(),
            )
            parsed = parse_chat_reply(reply.json(self.name), self.name)
            pace = ratelimit.pace_of(reply.headers)
            return parsed if pace is None else dataclasses.replace(parsed, pace=pace)
        except ExecutorError as exc:
            raise http_client.redact_error(exc, settings.api_key) from None

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        model = request.model or self._settings.default_model
        if not model:
            raise PermanentError(
                f"{self.name}: no model (set the schedule's model or the provider's default_model)"
            )
        try:
            params = generation_params(request.params)
        except ValidationError as exc:
            raise PermanentError(f"{self.name}: {exc}") from None
        messages = build_messages(request.prompt, request.params)
        schema = request.output_schema
        if schema is not None:
            mode = self._settings.structured_output
            params = {**params, "response_format": response_format(schema, mode)}
            if mode == "json_object":  # the schema goes in words, and json_object needs "JSON"
                messages.insert(0, {"role": "system", "content": structured.instructions(schema)})
        if budgets.is_agent_run(request.params):
            return await agent.run(
                self.chat_completion, request, provider=self.name, model=model, params=params,
                messages=messages, tools=self._tools,
            )  # fmt: skip

        async def ask() -> ExecutionResult:
            reply = await self.chat_completion(messages, model=model, params=params)
            return ExecutionResult(
                agent.answer_text(reply, self.name), usage=reply.usage or None, pace=reply.pace
            )

        if schema is None:
            return await ask()
        return await structured.answer(
            schema, ask, lambda first, why: agent.ask_again(messages, first, why, ask),
            provider=self.name,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self._http.aclose()
