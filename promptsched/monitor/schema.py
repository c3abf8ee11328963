"""A schedule's ``output_schema``: checked when it is saved (size, depth, a valid JSON Schema
with local references only, an object at the root), an answer read as JSON and checked against
it with the failing path named (jsonschema, Draft 2020-12 unless the schema says otherwise)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema import exceptions as schema_errors

from promptsched.errors import ValidationError

FIELD = "output_schema"
# The schema as compact JSON at most, and its nesting (objects and arrays of the document).
MAX_BYTES = 16_384
MAX_DEPTH = 24
# A validation error quotes the answer; this much of it at most.
MESSAGE_CHARS = 300
_NAME = re.compile(r"[^A-Za-z0-9_-]+")
# The first fenced block, wherever it is: "Here is the status:\n```json\n{...}\n```".
_FENCED = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?```", re.DOTALL | re.IGNORECASE)
# json's own messages, in words a reader of a run's error knows
_JSON_WORDS = {
    "Expecting value": "a value is missing",
    "Expecting ',' delimiter": "a comma is missing",
    "Expecting ':' delimiter": "a colon is missing",
    "Expecting property name enclosed in double quotes": "a key is not in double quotes",
    "Unterminated string starting at": "a string is not closed",
    "Extra data": "more text follows the JSON",
    "Invalid control character at": "a string holds a raw line break or control character",
    "Invalid \\escape": "a string holds an invalid backslash escape",
}


def pointer(path: Iterable[Any]) -> str:
    """A JSON Pointer (RFC 6901) from a path of keys and indexes; ``""`` is the root."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _where(path: Iterable[Any]) -> str:
    return pointer(path) or "the root"


def _depth(value: Any, limit: int) -> int:
    """The nesting of a JSON document, counted no further than ``limit + 1``."""
    stack, deepest = [(value, 1)], 0
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _refs(value: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("$ref", "$dynamicRef"):
                yield (*path, key), item
            yield from _refs(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _refs(item, (*path, index))


def check(value: Any) -> dict[str, Any] | None:
    """The schema as stored, or None (no schema); raises ``ValidationError`` naming
    ``output_schema`` and where in it the problem is."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError(FIELD, "must be a JSON Schema object (or null for none)")
    schema = dict(value)
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_BYTES:
        raise ValidationError(
            FIELD, f"is too large ({size:,} bytes as JSON, at most {MAX_BYTES:,})"
        )
    if _depth(schema, MAX_DEPTH) > MAX_DEPTH:
        raise ValidationError(FIELD, f"nests deeper than {MAX_DEPTH} levels")
    dialect = schema.get("$schema")
    if dialect is not None and _DIALECTS.get(str(dialect).rstrip("#")) is None:
        known = ", ".join(_DIALECTS)
        raise ValidationError(
            FIELD, f"at /$schema: unknown dialect {dialect!r:.80}; known: {known}"
        )
    try:
        validator_class(schema).check_schema(schema)
    except schema_errors.SchemaError as exc:
        message = _clip(exc.message)
        raise ValidationError(
            FIELD, f"is not a valid JSON Schema: at {_where(exc.absolute_path)}: {message}"
        ) from None
    for path, ref in _refs(schema):
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise ValidationError(
                FIELD, f"at {_where(path)}: only references within the schema (#...) are allowed"
            )
    if schema.get("type") != "object":
        raise ValidationError(
            FIELD, 'must describe a JSON object at its root ("type": "object"), as structured '
            "outputs require",
        )  # fmt: skip
    return schema


_DIALECTS: dict[str, Any] = {
    "https://json-schema.org/draft/2020-12/schema": jsonschema.Draft202012Validator,
    "https://json-schema.org/draft/2019-09/schema": jsonschema.Draft201909Validator,
    "http://json-schema.org/draft-07/schema": jsonschema.Draft7Validator,
    "http://json-schema.org/draft-06/schema": jsonschema.Draft6Validator,
    "http://json-schema.org/draft-04/schema": jsonschema.Draft4Validator,
}


def validator_class(schema: Mapping[str, Any]) -> Any:
    """The jsonschema class of the schema's dialect (Draft 2020-12 unless it says otherwise)."""
    dialect = schema.get("$schema")
    found = _DIALECTS.get(str(dialect).rstrip("#")) if dialect is not None else None
    return found or jsonschema.Draft202012Validator


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


@lru_cache(maxsize=256)
def validator(text: str) -> Any:
    """The jsonschema validator of a schema's canonical text (``key``), cached by it: every
    run of a schedule checks against the same schema."""
    schema = json.loads(text)
    return validator_class(schema)(schema)


def key(schema: Mapping[str, Any]) -> str:
    """The schema's canonical text (the validator cache's key)."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def read_answer(text: str) -> Any:
    """The answer's JSON: the whole text, else the first fenced block in it (a sentence may
    come before it). Raises ``ValueError`` in our words when it is not JSON."""
    body = text.strip()
    if not body:
        raise ValueError("the answer is not JSON: it is empty")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        whole = exc
    fenced = _FENCED.search(body)
    if fenced is None:
        if body[:1] in ("{", "["):
            raise ValueError(f"the answer is not JSON: {_json_words(whole)}") from None
        raise ValueError(
            "the answer is not JSON: it is text, with no JSON object and no ```json block"
        ) from None
    try:
        return json.loads(fenced.group(1).strip())
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the answer's ```json block is not JSON: {_json_words(exc)}") from None


def _json_words(exc: BaseException) -> str:
    """Why a text is not JSON, in words ("a comma is missing at line 3, column 9")."""
    if isinstance(exc, RecursionError):
        return "it nests too deeply"
    if not isinstance(exc, json.JSONDecodeError):
        return "it cannot be read"
    words = next((w for m, w in _JSON_WORDS.items() if exc.msg.startswith(m)), None)
    where = f"line {exc.lineno}, column {exc.colno}"
    return f"{words} at {where}" if words else f"it cannot be read at {where}"


def problem(schema: Mapping[str, Any], data: Any) -> str | None:
    """Why ``data`` does not match ``schema`` (``at /path: message``), or None when it does.
    It runs the schema's regular expressions on ``data`` here: the service checks a schema
    that has any in a process of its own (``patterns.py``)."""
    return explain(validator(key(schema)), data)


def explain(checker: Any, data: Any) -> str | None:
    """Why ``data`` does not match the schema of ``checker`` (a jsonschema validator)."""
    error = schema_errors.best_match(checker.iter_errors(data))
    if error is None:
        return None
    return f"at {_where(error.absolute_path)}: {_clip(error.message)}"


@lru_cache(maxsize=1024)
def has_patterns(text: str) -> bool:
    """Whether the schema (its canonical text, ``key``) holds a ``pattern`` or a
    ``patternProperties`` anywhere: the keywords whose regular expressions jsonschema runs on
    the answer (those of patternProperties in additionalProperties and unevaluatedProperties
    too); a value in ``const`` or ``enum`` that looks like one counts
    too (a check in the other process costs little; a missed pattern could stall the loop)."""
    stack: list[Any] = [json.loads(text)]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("pattern"), str) or item.get("patternProperties"):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def strict_compatible(schema: Mapping[str, Any]) -> bool:
    """Whether strict structured outputs accept the schema as it is: every object lists all its
    properties as required and allows no others (the rule OpenAI documents for ``strict``)."""
    stack: list[Any] = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "object" or "properties" in item:
                props = item.get("properties", {})
                if item.get("additionalProperties") is not False:
                    return False
                if not isinstance(props, dict) or set(item.get("required", [])) != set(props):
                    return False
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def response_name(schema: Mapping[str, Any]) -> str:
    """The ``json_schema.name`` a request gives: the schema's title as letters, digits, ``_``
    and ``-`` (at most 64), or ``output``."""
    title = schema.get("title")
    name = _NAME.sub("_", title).strip("_")[:64] if isinstance(title, str) else ""
    return name or "output"
