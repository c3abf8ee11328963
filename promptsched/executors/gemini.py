"""The ``gemini`` provider: Google's Gemini API, ``POST {base_url}/v1beta/models/{model}:
generateContent`` with the key in ``x-goog-api-key`` (docs/providers.md).

The schedule's ``system`` param is the ``systemInstruction``, the rendered prompt the user's
``contents``, its generation params the ``generationConfig``; the output is the first
candidate's text parts joined, its usage the ``usageMetadata``. A 429 ``RESOURCE_EXHAUSTED``
is throttling, waiting as long as its ``RetryInfo`` detail says when no ``Retry-After`` does.
An answer in a schema is asked for with ``responseMimeType: application/json`` and a
``responseSchema`` in Gemini's own schema dialect (an OpenAPI subset: ``response_schema``
says what it keeps); every answer is still checked against the whole schema here. An agent
run's tools are Gemini function declarations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from promptsched.errors import PermanentError
from promptsched.executors import agent, chat, http_client, structured
from promptsched.executors.settings import ProviderSettings

# Schedule param -> generationConfig field.
WIRE_NAMES: Mapping[str, str] = {
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "max_tokens": "maxOutputTokens",
    "stop": "stopSequences",
    "seed": "seed",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
}
GENERATION_PARAMS: Mapping[str, Callable[[Any], Any]] = {
    "temperature": chat.between(0, 2),
    "top_p": chat.between(0, 1),
    "top_k": chat.positive,
    "max_tokens": chat.positive,
    "stop": chat.stop,
    "seed": chat.whole,
    "presence_penalty": chat.between(-2, 2),
    "frequency_penalty": chat.between(-2, 2),
}
JSON_MIME = "application/json"
# A candidate that ended this way without text was withheld, not lost: the model's refusal.
_WITHHELD = frozenset({
    "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
    "LANGUAGE",
})  # fmt: skip
_DELAY = re.compile(r"(\d+(?:\.\d+)?)s")


def retry_delay(body: str) -> float | None:
    """The wait a Google error body names: its ``google.rpc.RetryInfo`` detail's
    ``retryDelay`` (a protobuf Duration, ``"34s"``, ``"0.5s"``), or None."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else ():
        if not isinstance(detail, dict) or not str(detail.get("@type", "")).endswith(
            "google.rpc.RetryInfo"
        ):
            continue
        match = _DELAY.fullmatch(str(detail.get("retryDelay", "")).strip())
        if match is not None:
            return float(match.group(1))
    return None


# 429 RESOURCE_EXHAUSTED (a quota) and 503 UNAVAILABLE (the model overloaded) are "not now".
PUSHBACK = http_client.Pushback(throttled=frozenset({503}), body_delay=retry_delay)


def generation_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The ``generationConfig`` fields; ``ValidationError`` naming ``params.KEY`` otherwise."""
    body = chat.convert_params(params, GENERATION_PARAMS)
    stop = body.get("stop")
    if isinstance(stop, str):
        body["stop"] = [stop]
    return {WIRE_NAMES[key]: value for key, value in body.items()}


def validate_params(params: Mapping[str, Any]) -> None:
    generation_params(params)


def usage_of(raw: Any) -> dict[str, int]:
    """The run's usage from ``usageMetadata``: prompt tokens are the prompt's (and tool-use
    prompt's), completion tokens the candidates' and the thoughts' (both billed as output);
    the cached part of the prompt (``cache_read_input_tokens``) and the thoughts are kept."""
    counts = chat.usage_counts(raw)
    if not counts:
        return {}
    prompt = counts.get("promptTokenCount", 0) + counts.get("toolUsePromptTokenCount", 0)
    completion = counts.get("candidatesTokenCount", 0) + counts.get("thoughtsTokenCount", 0)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": counts.get("totalTokenCount", prompt + completion)}  # fmt: skip
    if "cachedContentTokenCount" in counts:
        usage["cache_read_input_tokens"] = counts["cachedContentTokenCount"]
    if "thoughtsTokenCount" in counts:
        usage["thoughts_tokens"] = counts["thoughtsTokenCount"]
    return usage


# --- JSON Schema -> Gemini's schema dialect ---------------------------------------------------

_TYPES = {"string", "number", "integer", "boolean", "array", "object"}
_FORMATS = {"string": {"enum", "date-time"}, "number": {"float", "double"},
            "integer": {"int32", "int64"}}  # fmt: skip
_KEPT = (
    "title", "description", "minimum", "maximum", "minItems", "maxItems", "minLength",
    "maxLength", "pattern", "minProperties", "maxProperties", "default", "example",
)  # fmt: skip
# Keywords whose meaning is the whole schema's; they are not constraints to drop.
_SKIPPED = frozenset({"$schema", "$id", "$defs", "definitions", "$comment", "examples"})
_HANDLED = frozenset({
    "type", "nullable", "format", "const", "enum", "anyOf", "oneOf", "items", "properties",
    "required", *_KEPT, *_SKIPPED,
})  # fmt: skip
_MAX_REF_DEPTH = 8


class _Unsupported(Exception):
    """The schema cannot be said in Gemini's dialect without losing its shape."""


class _Converter:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.dropped: set[str] = set()

    def resolve(self, ref: Any, refs: int) -> Mapping[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#/") or refs > _MAX_REF_DEPTH:
            raise _Unsupported("$ref")
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, Mapping) or part not in node:
                raise _Unsupported("$ref")
            node = node[part]
        if not isinstance(node, Mapping):
            raise _Unsupported("$ref")
        return node

    def convert(self, node: Any, refs: int = 0) -> dict[str, Any]:
        """``node`` in the dialect; ``refs``: the references followed to reach it."""
        if not isinstance(node, Mapping):  # true/false schemas
            raise _Unsupported("boolean schemas")
        if "$ref" in node:
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return self.convert({**self.resolve(node["$ref"], refs + 1), **extra}, refs + 1)
        kind = node.get("type")
        nullable = node.get("nullable") is True
        if isinstance(kind, list):
            nullable = nullable or "null" in kind
            kinds = [k for k in kind if k != "null"]
            if len(kinds) != 1:
                options = [self.convert({**node, "type": k}, refs) for k in kinds]
                return {"anyOf": options, "nullable": True} if nullable else {"anyOf": options}
            kind = kinds[0]
        if kind is not None and kind not in _TYPES:
            raise _Unsupported(f"type {kind!r}")
        out: dict[str, Any] = {"type": str(kind).upper()} if kind is not None else {}
        if nullable:
            out["nullable"] = True
        out.update(self._values(node, kind))
        out.update(self._children(node, kind, refs))
        self.dropped.update(key for key in node if key not in _HANDLED)
        return out

    def _values(self, node: Mapping[str, Any], kind: Any) -> dict[str, Any]:
        out = {key: node[key] for key in _KEPT if key in node}
        fmt = node.get("format")
        if fmt is not None:
            if isinstance(kind, str) and fmt in _FORMATS.get(kind, ()):
                out["format"] = fmt
            else:
                self.dropped.add("format")
        for key, values in (("const", [node.get("const")]), ("enum", node.get("enum"))):
            if key not in node:
                continue
            if isinstance(values, list) and all(isinstance(v, str) for v in values):
                out["enum"] = list(values)
            else:
                self.dropped.add(key)
        return out

    def _children(self, node: Mapping[str, Any], kind: Any, refs: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("anyOf", "oneOf"):
            if key in node:
                if key == "oneOf":
                    self.dropped.add("oneOf (asked as anyOf)")
                out["anyOf"] = [self.convert(option, refs) for option in node[key]]
        if "items" in node:
            out["items"] = self.convert(node["items"], refs)
        elif kind == "array":
            raise _Unsupported("an array without items")
        properties = node.get("properties")
        if isinstance(properties, Mapping) and properties:
            out["properties"] = {
                name: self.convert(value, refs) for name, value in properties.items()
            }
            out["propertyOrdering"] = list(properties)
            required = [name for name in node.get("required") or () if name in properties]
            if required:
                out["required"] = required
        elif kind == "object":
            raise _Unsupported("an object without properties")
        return out


def response_schema(schema: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """``schema`` in Gemini's dialect and the JSON Schema keywords it had to drop, or None when
    it cannot be said there without losing its shape (an object without properties, an array
    without items, a recursive or outside ``$ref``, a ``null`` type, a boolean schema): then
    only ``responseMimeType`` asks for JSON and the schema goes in words.

    Kept: ``type`` (a list with ``null`` as ``nullable``, other lists as ``anyOf``),
    ``properties`` (with ``propertyOrdering``), ``required``, ``items``, ``anyOf``, string
    ``enum`` and ``const``, ``format`` where Gemini knows it, ``title``, ``description``,
    ``minimum``, ``maximum``, ``minItems``, ``maxItems``, ``minLength``, ``maxLength``,
    ``pattern``, ``minProperties``, ``maxProperties``, ``default``, ``example``; local
    ``$ref`` inlined; ``oneOf`` asked as ``anyOf``. Dropped (the answer is still checked for
    them): ``additionalProperties``, ``patternProperties``, ``allOf``, ``not``,
    ``if``/``then``/``else``, ``exclusiveMinimum``/``exclusiveMaximum``, ``multipleOf``,
    ``uniqueItems``, ``prefixItems``, ``contains``, ``dependentRequired``, other formats,
    non-string ``enum``/``const``, and any other keyword."""
    converter = _Converter(schema)
    try:
        converted = converter.convert(schema)
    except _Unsupported:
        return None, []
    return converted, sorted(converter.dropped)


# --- the conversation -------------------------------------------------------------------------


def _arguments(call: Mapping[str, Any]) -> Any:
    raw = (call.get("function") or {}).get("arguments")
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else raw or {}
    except ValueError:
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": value}


def _add(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def conversation(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The ``systemInstruction`` text and the ``contents`` of the conversation."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # a tool call's id -> its function, for its response
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "system":
            system.append(str(content))
        elif role == "assistant":
            parts: list[dict[str, Any]] = [{"text": str(content)}] if content else []
            for call in message.get("tool_calls") or []:
                name = (call.get("function") or {}).get("name")
                names[str(call.get("id"))] = str(name)
                part: dict[str, Any] = {"functionCall": {"name": name, "args": _arguments(call)}}
                if call.get("signature"):  # Gemini asks for its thought signature back
                    part["thoughtSignature"] = call["signature"]
                parts.append(part)
            _add(contents, "model", parts)
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "tool")
            response = {"functionResponse": {"name": name, "response": {"content": str(content)}}}
            _add(contents, "user", [response])
        else:
            _add(contents, "user", [{"text": str(content)}])
    return "\n\n".join(system), contents


def _declaration(spec: Mapping[str, Any]) -> dict[str, Any]:
    function = spec.get("function") or {}
    declaration: dict[str, Any] = {
        "name": function.get("name"),
        "description": function.get("description") or "",
    }
    parameters = function.get("parameters")
    if isinstance(parameters, Mapping) and parameters.get("properties"):
        converted, _ = response_schema(parameters)
        if converted is not None:
            declaration["parameters"] = converted
        else:
            declaration["parametersJsonSchema"] = dict(parameters)
    return declaration


class GeminiExecutor(chat.ChatExecutor):
    """POSTs ``{base_url}/v1beta/models/{model}:generateContent``."""

    pushback = PUSHBACK
    models_path = "/v1beta/models"
    models_field = "models"

    @staticmethod
    def key_refused(status: int | None, message: str) -> bool:
        """Gemini refuses a wrong key with a 400 (``API_KEY_INVALID``: "API key not valid"),
        not a 401."""
        wrong_key = status == 400 and (
            "API key not valid" in message or "API_KEY_INVALID" in message
        )
        return wrong_key or chat.ChatExecutor.key_refused(status, message)

    def url(self, model: str) -> str:
        name = quote(model.removeprefix("models/"), safe="-._~")
        return f"{self._base_url}/v1beta/models/{name}:generateContent"

    @staticmethod
    def headers(settings: ProviderSettings) -> dict[str, str]:
        return http_client.request_headers(
            settings.headers, settings.api_key, key_header="x-goog-api-key"
        )

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
        converted = None
        if self._settings.structured_output != "json_object" and not agent_run:
            converted, _ = response_schema(schema)
        if converted is not None:
            return {**params, "responseMimeType": JSON_MIME, "responseSchema": converted}
        messages.insert(0, {"role": "system", "content": structured.instructions(schema)})
        # Function calling and a JSON response type do not go together on Gemini 2.x: an agent
        # run is told the schema in words only.
        return params if agent_run else {**params, "responseMimeType": JSON_MIME}

    def payload(
        self, messages: Sequence[Mapping[str, Any]], model: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        system, contents = conversation(messages)
        body: dict[str, Any] = {"contents": contents}
        if system:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        config = {key: value for key, value in params.items() if key != "tools"}
        if config:
            body["generationConfig"] = config
        specs = params.get("tools") or []
        if specs:
            body["tools"] = [{"functionDeclarations": [_declaration(spec) for spec in specs]}]
        return body

    def read(self, data: Any, params: Mapping[str, Any]) -> agent.ChatReply:
        provider = self.name
        if not isinstance(data, dict):
            raise http_client.invalid_response(provider, "expected a JSON object")
        usage = usage_of(data.get("usageMetadata"))
        candidates = data.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            feedback = data.get("promptFeedback")
            reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
            if reason:
                raise PermanentError(
                    f"{provider}: the prompt was blocked ({reason})", usage=usage or None
                )
            error = http_client.body_excerpt(json.dumps(data)) if "error" in data else None
            raise http_client.invalid_response(provider, error or "no candidates")
        candidate = candidates[0]
        if not isinstance(candidate, dict):
            raise http_client.invalid_response(provider, "candidates[0] is not an object")
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for index, part in enumerate(parts if isinstance(parts, list) else ()):
            if not isinstance(part, dict) or part.get("thought") is True:
                continue
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            call = part.get("functionCall")
            if isinstance(call, dict):
                if not isinstance(call.get("name"), str):
                    raise http_client.invalid_response(
                        provider, f"candidates[0].content.parts[{index}] has no function name"
                    )
                call_id = call.get("id")
                entry = {
                    "id": call_id if isinstance(call_id, str) and call_id else f"call_{index}",
                    "type": "function",
                    "function": {"name": call["name"],
                                 "arguments": json.dumps(call.get("args") or {})},
                }  # fmt: skip
                if isinstance(part.get("thoughtSignature"), str):
                    entry["signature"] = part["thoughtSignature"]
                calls.append(entry)
        finish = candidate.get("finishReason")
        text: str | None = "".join(texts) if texts else None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        elif text is None and finish in _WITHHELD:
            message["refusal"] = f"the answer was withheld (finishReason {finish})"
        return agent.ChatReply(
            message=message,
            content=text,
            finish_reason=finish if isinstance(finish, str) else None,
            usage=usage,
        )
