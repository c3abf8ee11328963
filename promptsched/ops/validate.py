"""The small validator that checks request bodies and parameters against the API's schemas
(the JSON Schema subset they use), naming the offending field, plus the checks Postgres needs."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from promptsched.errors import ValidationError
from promptsched.ops import schemas

MAX_DEPTH = 32
MAX_DIGITS = 100  # digits of an integer anywhere in a body (an id needs 19)


class Malformed(ValidationError):
    """Not JSON as RFC 8259 defines it: answered 400, not 422. ``field`` is "" when the
    problem is the body as a whole."""


@dataclass(frozen=True, slots=True)
class _NotJson:
    """``NaN``, ``Infinity`` or ``-Infinity`` where a value was: Python's parser accepts them,
    JSON does not; kept as a marker so the error can name the field."""

    token: str


@dataclass(frozen=True, slots=True)
class _HugeInteger:
    digits: int


def _integer(text: str) -> int | _HugeInteger:
    digits = len(text) - text.startswith("-")
    return int(text) if digits <= MAX_DIGITS else _HugeInteger(digits)


def parse_json(raw: bytes, *, what: str = "the body") -> Any:
    """A request body (or ``what`` else) as JSON: UTF-8, an optional byte-order mark ignored,
    every failure a ``Malformed`` in our words. Pass the result to ``check_storable`` next,
    which names the field of a NaN or an over-long integer."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed("", f"{what} is not valid UTF-8 (at byte {exc.start})") from None
    try:
        return json.loads(text.removeprefix("\ufeff"), parse_int=_integer, parse_constant=_NotJson)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise Malformed("", f"{what} is not valid JSON: {exc.msg} at {where}") from None
    except RecursionError:
        raise Malformed("", f"{what} nests deeper than {MAX_DEPTH} levels") from None


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def _name(field: str) -> str:
    return field or "body"


def types_of(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    return kind if isinstance(kind, list) else [kind] if kind else []


def _check_type(value: Any, kinds: list[str], field: str) -> Any:
    if not kinds:
        return value
    if isinstance(value, float) and "integer" in kinds and value.is_integer():
        return int(value)  # JSON Schema counts 3.0 as an integer
    for kind in kinds:
        if kind == "null":
            continue
        wanted = _PY_TYPES[kind]
        if isinstance(value, wanted) and (kind == "boolean" or not isinstance(value, bool)):
            return value
    expected = " or ".join(k for k in kinds if k != "null")
    raise ValidationError(_name(field), f"must be {_article(expected)}")


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _check_string(value: str, schema: Mapping[str, Any], field: str) -> None:
    if len(value) < schema.get("minLength", 0):
        raise ValidationError(_name(field), "must not be empty")
    limit = schema.get("maxLength")
    if limit is not None and len(value) > limit:
        raise ValidationError(
            _name(field), f"is too long ({len(value)} characters, at most {limit})"
        )
    pattern = schema.get("pattern")
    if pattern is not None and not re.search(pattern, value):
        raise ValidationError(_name(field), f"does not have the expected form {pattern}")
    if schema.get("format") == "date-time":
        instant(value, field)


def _check_number(value: float, schema: Mapping[str, Any], field: str) -> None:
    low, high = schema.get("minimum"), schema.get("maximum")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValidationError(_name(field), f"must be {bounds}, got {value}")


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], field: str) -> dict[str, Any]:
    props: Mapping[str, Any] = schema.get("properties", {})
    prefix = f"{field}." if field else ""
    if schema.get("additionalProperties", True) is False:
        for key in value:
            if key not in props:
                close = difflib.get_close_matches(key, list(props), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValidationError(prefix + key, f"is not a known field{hint}")
    for key in schema.get("required", ()):
        if key not in value:
            raise ValidationError(prefix + key, "is required")
    return {
        key: check(item, props[key], prefix + key) if key in props else item
        for key, item in value.items()
    }


def check(value: Any, schema: Mapping[str, Any], field: str = "") -> Any:
    """``value`` checked against ``schema`` (the JSON Schema subset used here), normalized (an
    integral float becomes an int); raises ValidationError naming the field."""
    if "$ref" in schema:
        schema = schemas.COMPONENTS[schema["$ref"].rsplit("/", 1)[-1]]
    kinds = types_of(schema)
    if value is None:
        if not kinds or "null" in kinds:
            return None
        raise ValidationError(_name(field), "must not be null")
    value = _check_type(value, kinds, field)
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(map(str, schema["enum"]))
        raise ValidationError(_name(field), f"must be one of {choices}; got {value!r:.60}")
    if isinstance(value, str):
        _check_string(value, schema, field)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(value, schema, field)
    elif isinstance(value, dict):
        return _check_object(value, schema, field)
    elif isinstance(value, list) and "items" in schema:
        return [
            check(item, schema["items"], f"{_name(field)}[{i}]") for i, item in enumerate(value)
        ]
    return value


def check_storable(value: Any, field: str = "", depth: int = 0) -> None:
    """Refuse what Postgres cannot store or what nests absurdly deep: NUL characters, lone
    surrogates, non-finite numbers and over-long integers anywhere in a JSON document."""
    if depth > MAX_DEPTH:
        raise ValidationError(_name(field), f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, _NotJson):
        raise Malformed(_name(field), f"{value.token} is not JSON (JSON has no NaN or Infinity)")
    if isinstance(value, _HugeInteger):
        raise ValidationError(
            _name(field), f"is a number of {value.digits} digits; at most {MAX_DIGITS}"
        )
    if isinstance(value, str):
        _check_text(value, field)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(_name(field), "must be a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{field}.{key}" if field else key
            _check_text(key, name)
            check_storable(item, name, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_storable(item, f"{_name(field)}[{i}]", depth + 1)


def _check_text(text: str, field: str) -> None:
    if "\x00" in text:
        raise ValidationError(_name(field), "must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(_name(field), "must be valid Unicode (a lone surrogate)") from None


EARLIEST = datetime.fromisoformat("1970-01-01T00:00:00+00:00")
LATEST = datetime.fromisoformat("2200-01-01T00:00:00+00:00")


def instant(text: str, field: str, *, zone: Any = None) -> datetime:
    """An ISO-8601 date-time with a UTC offset (or, given ``zone``, a local one read in it),
    between 1970 and 2200."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValidationError(_name(field), f"not an ISO-8601 date-time: {text[:60]!r}") from None
    if value.tzinfo is None:
        if zone is None:
            raise ValidationError(_name(field), "needs a UTC offset, e.g. 2026-03-02T09:00:00Z")
        value = value.replace(tzinfo=zone)
    if not EARLIEST <= value < LATEST:
        raise ValidationError(_name(field), "must be between 1970 and 2200")
    return value
