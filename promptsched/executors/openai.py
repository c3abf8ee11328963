"""The ``openai`` provider: a chat completion from any OpenAI-compatible endpoint."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from promptsched.executors import agent, chat, http_client, structured
from promptsched.executors.chat import SYSTEM_PARAM, build_messages
from promptsched.executors.settings import ProviderSettings, StructuredOutput
from promptsched.monitor import schema as output_schema

__all__ = ["SYSTEM_PARAM", "OpenAIExecutor", "build_messages", "generation_params"]


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
    "temperature": chat.between(0, 2),
    "top_p": chat.between(0, 1),
    "presence_penalty": chat.between(-2, 2),
    "frequency_penalty": chat.between(-2, 2),
    "max_tokens": chat.positive,
    "max_completion_tokens": chat.positive,
    "seed": chat.whole,
    "stop": chat.stop,
    "response_format": _response_format,
}


def generation_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The request body's generation fields from a schedule's params (``system`` excluded).

    Raises ``ValidationError`` naming ``params.KEY`` for an unknown key or a bad value, so the
    API can reject it when the schedule is saved. The agent params (``tools``, budgets) are
    the tool loop's (``budget.py``), not the request's.
    """
    return chat.convert_params(params, GENERATION_PARAMS)


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
    finish_reason = choices[0].get("finish_reason")
    return agent.ChatReply(
        message=message,
        content=content,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        usage=chat.usage_counts(data.get("usage")),
    )


class OpenAIExecutor(chat.ChatExecutor):
    """POSTs ``{base_url}/chat/completions``: the conversation as it is, the key as
    ``Authorization: Bearer``."""

    def url(self, model: str) -> str:
        return f"{self._base_url}/chat/completions"

    @staticmethod
    def headers(settings: ProviderSettings) -> dict[str, str]:
        return http_client.request_headers(settings.headers, settings.api_key)

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
        mode = self._settings.structured_output
        if mode == "json_object":  # the schema goes in words, and json_object needs "JSON"
            messages.insert(0, {"role": "system", "content": structured.instructions(schema)})
        return {**params, "response_format": response_format(schema, mode)}

    def payload(
        self, messages: Sequence[Mapping[str, Any]], model: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        return {**params, "model": model, "messages": list(messages)}

    def read(self, data: Any, params: Mapping[str, Any]) -> agent.ChatReply:
        return parse_chat_reply(data, self.name)
