"""Text from outside made storable where it enters: ``clean`` is the one rule for every answer,
error, header, tool result, transcript step, follow-up decision and receiver's body we keep.

Postgres stores no NUL in text and no ``\\u0000`` in jsonb, and UTF-8 has no lone surrogates,
so one such character anywhere in a batched write used to fail the whole batch
(docs/reliability.md, "Isolation of failure"). ``clean`` replaces each NUL, each lone surrogate
(which is also how ``decode`` carries a byte that is not UTF-8) and each non-finite number in
JSON (jsonb has no NaN) with U+FFFD (null for a number), in keys as in values, and adds how
many it replaced to the tally of the attempt it runs for (``counting``), so the run records
that what it stored was cleaned. A clean value is returned as it is, with no copy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, overload

REPLACEMENT = "\ufffd"
# What no Postgres text or jsonb value can hold: NUL, and a surrogate (in a Python str, any
# surrogate is a lone one: json.loads joins a pair into one character).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


@dataclass
class Tally:
    """Characters (and numbers) replaced so far for one attempt."""

    count: int = 0


_TALLY: ContextVar[Tally | None] = ContextVar("promptsched_storable_tally", default=None)


@contextmanager
def counting() -> Iterator[Tally]:
    """Count what ``clean`` replaces in this task (and the tasks it starts) until the end of
    the block: one attempt's tally."""
    tally = Tally()
    token = _TALLY.set(tally)
    try:
        yield tally
    finally:
        _TALLY.reset(token)


@overload
def clean(value: str) -> str: ...
@overload
def clean(value: Any) -> Any: ...
def clean(value: Any) -> Any:
    """``value`` (a str, or JSON: dicts, lists, strings, numbers) with every NUL and lone
    surrogate replaced by U+FFFD and every NaN or infinity by None; ``value`` itself when
    there was nothing to replace. The count goes to the current tally, if any."""
    if isinstance(value, str):
        if _UNSTORABLE.search(value) is None:
            return value
        cleaned, count = _UNSTORABLE.subn(REPLACEMENT, value)
        _count(count)
        return cleaned
    if not _dirty(value):
        return value
    return _cleaned(value)


def decode(body: bytes, charset: str | None = None) -> str:
    """Bytes from outside as storable text: a byte that is not valid in ``charset`` (UTF-8
    when it is missing or unknown) becomes U+FFFD, counted as ``clean`` counts."""
    try:
        text = body.decode(charset or "utf-8", "surrogateescape")
    except LookupError:  # a charset no codec knows: read it as UTF-8
        text = body.decode("utf-8", "surrogateescape")
    return clean(text)


def _count(count: int) -> None:
    tally = _TALLY.get()
    if tally is not None:
        tally.count += count


def _bad_scalar(value: Any) -> bool:
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    return isinstance(value, float) and not math.isfinite(value)


def _dirty(value: Any) -> bool:
    """Whether anything in ``value`` needs replacing (a walk with a stack, not recursion: JSON
    from outside may nest as deep as its parser allowed)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, inner in item.items():
                if _bad_scalar(key):
                    return True
                stack.append(inner)
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif _bad_scalar(item):
            return True
    return False


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, float) and not math.isfinite(value):
        _count(1)
        return None
    return value


def _shell(value: Any) -> dict[Any, Any] | list[Any] | None:
    if isinstance(value, Mapping):
        return {}
    if isinstance(value, list | tuple):
        return []
    return None


def _cleaned(value: Any) -> Any:
    """A cleaned copy of ``value`` (Mappings become dicts, tuples lists), built with a stack."""
    top = _shell(value)
    if top is None:
        return _scalar(value)
    work: list[tuple[Any, dict[Any, Any] | list[Any]]] = [(value, top)]
    while work:
        source, target = work.pop()
        pairs = source.items() if isinstance(source, Mapping) else enumerate(source)
        for key, item in pairs:
            copy = _shell(item)
            if copy is None:
                copy = _scalar(item)
            else:
                work.append((item, copy))
            if isinstance(target, dict):
                target[_scalar(key)] = copy
            else:
                target.append(copy)
    return top
