"""HTML built by construction: every value put into a template is escaped, unless it is
``Markup`` that this module itself produced (an escaped value, or a rendered template)."""

from __future__ import annotations

import html
import string
from collections.abc import Iterable


class Markup(str):
    """Text that is already safe HTML. ``+`` keeps it safe (a plain ``str`` added to it is
    escaped first); any other ``str`` operation gives a plain ``str`` again, which is escaped
    when interpolated."""

    __slots__ = ()

    def __add__(self, other: str) -> Markup:
        return Markup(str.__add__(self, esc(other)))

    def __radd__(self, other: str) -> Markup:
        return Markup(str.__add__(esc(other), self))


def esc(value: object) -> Markup:
    """``value`` as HTML text (quotes escaped too, so it is safe in a quoted attribute)."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return Markup("")
    return Markup(html.escape(str(value), quote=True))


class Template:
    """A ``string.Template`` whose every ``$name`` is escaped (``esc``) when rendered.

    Templates put values only in element text and in double-quoted attributes, never in
    script, style or unquoted attributes: there escaping is all the protection needed.
    """

    def __init__(self, text: str) -> None:
        self._template = string.Template(text)

    def __call__(self, **values: object) -> Markup:
        return Markup(self._template.substitute({k: esc(v) for k, v in values.items()}))


def join(parts: Iterable[object], sep: str = "") -> Markup:
    """The parts, each escaped unless it is Markup, joined by ``sep`` (itself escaped)."""
    return Markup(esc(sep).join(esc(part) for part in parts))


def attrs(**values: object) -> Markup:
    """` name="value"` pairs (``_`` in a name becomes ``-``; ``False``/``None`` are left
    out; ``True`` gives the bare attribute)."""
    out = []
    for name, value in values.items():
        key = name.rstrip("_").replace("_", "-")
        if value is None or value is False:
            continue
        out.append(f" {key}" if value is True else f' {key}="{esc(value)}"')
    return Markup("".join(out))
