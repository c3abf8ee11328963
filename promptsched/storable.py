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

import codecs
import math
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, overload

REPLACEMENT = "\ufffd"
_REPLACEMENT_UTF8 = REPLACEMENT.encode()
_HANDLER = "promptsched-storable"


class Tally:
    """Characters (and numbers) replaced so far for one attempt."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


_TALLY: ContextVar[Tally | None] = ContextVar("promptsched_storable_tally", default=None)


class counting:  # a context manager, named as the function it stands in for
    """Count what ``clean`` replaces in this task (and the tasks it starts) until the end of
    the block: one attempt's tally."""

    __slots__ = ("_token", "tally")

    def __init__(self) -> None:
        self.tally = Tally()

    def __enter__(self) -> Tally:
        self._token = _TALLY.set(self.tally)
        return self.tally

    def __exit__(self, *_: object) -> None:
        _TALLY.reset(self._token)


def _replace(error: UnicodeError) -> tuple[str | bytes, int]:
    """The codec error handler: one U+FFFD, counted, for each thing that is not UTF-8 (a lone
    surrogate when encoding, as UTF-8 bytes: the encoder takes no other text; an invalid
    sequence when decoding)."""
    if isinstance(error, UnicodeEncodeError):
        _count(error.end - error.start)
        return _REPLACEMENT_UTF8 * (error.end - error.start), error.end
    if isinstance(error, UnicodeDecodeError):
        _count(1)
        return REPLACEMENT, error.end
    raise error


codecs.register_error(_HANDLER, _replace)


@overload
def clean(value: str, *, counted: bool = True) -> str: ...
@overload
def clean(value: Any, *, counted: bool = True) -> Any: ...
def clean(value: Any, *, counted: bool = True) -> Any:
    """``value`` (a str, or JSON: dicts, lists, strings, numbers) with every NUL and lone
    surrogate replaced by U+FFFD and every NaN or infinity by None; ``value`` itself when
    there was nothing to replace. The count goes to the current tally (unless ``counted`` is
    false: a copy of what is counted elsewhere)."""
    if value is None:
        return None
    if not counted:
        with counting():
            return clean(value)
    if type(value) is str:
        return _text(value) if _bad_text(value) else value
    if type(value) in (int, bool) or (type(value) is dict and _counts(value)):
        return value
    if not _dirty(value):
        return value
    return _cleaned(value)


def decode(body: bytes, charset: str | None = None) -> str:
    """Bytes from outside as storable text: each sequence that is not valid in ``charset``
    (UTF-8 when it is missing or unknown) becomes U+FFFD, counted as ``clean`` counts."""
    try:
        text = body.decode(charset or "utf-8", _HANDLER)
    except LookupError:  # a charset no codec knows: read it as UTF-8
        text = body.decode("utf-8", _HANDLER)
    return clean(text)


def _counts(value: dict[Any, Any]) -> bool:
    """Whether ``value`` is what a usage nearly always is: ASCII names without NUL, each of a
    whole number (a loop cheaper than the general walk, on every attempt's path)."""
    for key, count in value.items():
        if type(count) is not int or type(key) is not str or "\x00" in key or not key.isascii():
            return False
    return True


def _bad_text(text: str) -> bool:
    """Whether ``text`` holds a NUL or a lone surrogate: a search for NUL, and only for text
    that is not ASCII (a flag of the str) an encoding to UTF-8, both at C speed."""
    if "\x00" in text:
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _text(text: str) -> str:
    nuls = text.count("\x00")
    if nuls:
        _count(nuls)
        text = text.replace("\x00", REPLACEMENT)
    if text.isascii():
        return text
    return text.encode("utf-8", _HANDLER).decode("utf-8")


def _count(count: int) -> None:
    tally = _TALLY.get()
    if tally is not None:
        tally.count += count


def _dirty(value: Any) -> bool:
    """Whether anything in ``value`` needs replacing (a walk with a stack, not recursion: JSON
    from outside may nest as deep as its parser allowed; exact types first, for speed)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is int or kind is bool or item is None:
            continue
        if kind is str:
            if _bad_text(item):
                return True
        elif kind is float:
            if not math.isfinite(item):
                return True
        elif kind is dict or isinstance(item, Mapping):
            for key, inner in item.items():
                if type(key) is str and _bad_text(key):
                    return True
                stack.append(inner)
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif isinstance(item, str | float):  # a subclass of either, rarely
            if _dirty(str(item) if isinstance(item, str) else float(item)):
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
