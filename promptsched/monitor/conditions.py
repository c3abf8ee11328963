"""A schedule's ``notify_when``: when a successful run notifies its targets.

    always                   every success notifies (the default)
    changed                  the output differs from the last success's (whitespace-normalised
                             text, or canonical JSON when the schedule has an output_schema)
    changed /status          the value at that JSON Pointer differs (needs an output_schema)
    /degraded                the value at that JSON Pointer is truthy (needs an output_schema)
    /status == "down"        ... equals that JSON value
    /status != "ok"          ... differs from that JSON value

Truthy as JavaScript reads JSON: false, null, 0, "", [], {} and a missing value are not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from promptsched.errors import ValidationError
from promptsched.monitor import changes

FIELD = "notify_when"
MAX_CHARS = 500
Kind = Literal["always", "changed", "truthy", "equals", "differs"]
_OPERATORS: dict[str, Kind] = {"==": "equals", "!=": "differs"}


@dataclass(frozen=True, slots=True)
class Condition:
    kind: Kind
    pointer: str = ""  # a JSON Pointer ("" the whole answer)
    value: Any = None  # what equals/differs compare with

    @property
    def structured(self) -> bool:
        """Whether it reads the structured output (and so needs an output_schema)."""
        return self.kind != "always" and (self.kind != "changed" or bool(self.pointer))


ALWAYS = Condition("always")


def _pointer(text: str) -> str:
    if not text.startswith("/"):
        raise ValidationError(FIELD, f"{text!r:.60} is not a JSON Pointer (it starts with /)")
    for token in text.split("/")[1:]:
        stripped = token.replace("~0", "").replace("~1", "")
        if "~" in stripped:
            raise ValidationError(FIELD, f"{text!r:.60}: '~' is written ~0 and '/' ~1 in a pointer")
    return text


def parse(text: str | None) -> Condition:
    """The condition, or ``ValidationError`` naming ``notify_when`` and what to write."""
    if text is None:
        return ALWAYS
    if not isinstance(text, str):
        raise ValidationError(FIELD, "must be a string: always, changed, or a condition")
    if len(text) > MAX_CHARS:
        raise ValidationError(FIELD, f"is too long ({len(text)} characters, at most {MAX_CHARS})")
    words = text.strip()
    if words in ("", "always"):
        return ALWAYS
    if words == "changed":
        return Condition("changed")
    if words.startswith("changed "):
        return Condition("changed", _pointer(words.removeprefix("changed ").strip()))
    if not words.startswith("/"):
        raise ValidationError(
            FIELD, f"{words!r:.60} is not a condition: write always, changed, changed /pointer, "
            '/pointer (truthy), /pointer == JSON or /pointer != JSON',
        )  # fmt: skip
    for operator, kind in _OPERATORS.items():
        if operator in words:
            left, right = words.split(operator, 1)
            try:
                value = json.loads(right.strip())
            except ValueError:
                raise ValidationError(
                    FIELD, f'{right.strip()!r:.60} is not a JSON value (quote strings: "down")'
                ) from None
            return Condition(kind, _pointer(left.strip()), value)
    if any(c.isspace() for c in words):
        raise ValidationError(
            FIELD, f"{words!r:.60}: compare with == or != (a pointer has no spaces)"
        )
    return Condition("truthy", _pointer(words))


@lru_cache(maxsize=1024)
def parsed(text: str) -> Condition:
    """``parse`` of a stored condition, cached: every run of a schedule reads the same one."""
    return parse(text)


def text(condition: Condition) -> str:
    """The condition as stored and shown (``parse`` reads it back)."""
    if condition.kind == "always":
        return "always"
    if condition.kind == "changed":
        return f"changed {condition.pointer}" if condition.pointer else "changed"
    if condition.kind == "truthy":
        return condition.pointer
    operator = "==" if condition.kind == "equals" else "!="
    return f"{condition.pointer} {operator} {shown(condition.value)}"


def resolve(document: Any, pointer: str) -> tuple[bool, Any]:
    """``(found, value)`` at the JSON Pointer (RFC 6901) in ``document``."""
    value = document
    for raw in pointer.split("/")[1:] if pointer else []:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return False, None
    return True, value


def truthy(value: Any) -> bool:
    return value not in (False, None, 0, "", [], {})


def shown(value: Any, limit: int = 80) -> str:
    """A JSON value as a reason quotes it (``"up"``, ``false``), clipped."""
    out = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return out if len(out) <= limit else out[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Verdict:
    notify: bool
    reason: str


def decide(condition: Condition, data: Any) -> Verdict:
    """Whether a success whose structured output is ``data`` notifies, and why (the reason a
    run records: ``/degraded is false``, ``/status is "up", not "down"``). For ``truthy``,
    ``equals`` and ``differs`` only: ``always`` and ``changed`` are decided elsewhere."""
    found, value = resolve(data, condition.pointer)
    now = f"{condition.pointer} is {shown(value)}" if found else f"{condition.pointer} is missing"
    if condition.kind == "truthy":
        return Verdict(found and truthy(value), now)
    equal = found and _same(value, condition.value)
    if condition.kind == "equals":
        return Verdict(equal, now if equal else f"{now}, not {shown(condition.value)}")
    if condition.kind == "differs":
        return Verdict(not equal, now)
    raise ValueError(f"{condition.kind} is not decided by a pointer")


def _same(a: Any, b: Any) -> bool:
    # JSON equality: 1 and 1.0 are one number, true is not 1, key order does not matter.
    return changes.canonical(a) == changes.canonical(b)
