"""Model output as safe HTML: CommonMark (with tables and strikethrough) rendered by
markdown-it-py, then sanitized by nh3 (ammonia), for the email HTML part and the console.

Both libraries do a job we should not write ourselves: a conforming CommonMark parser, and an
allowlist sanitizer that is the reference implementation of its kind. The output never carries
scripts, event handlers, styles, remote images (tracking pixels)
or non-web URLs, whatever the model wrote.
"""

from __future__ import annotations

from typing import Final

import nh3
from markdown_it import MarkdownIt
from markdown_it.token import Token

_TAGS: Final = frozenset(
    {
        "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
        "hr", "li", "ol", "p", "pre", "s", "strong", "table", "tbody", "td", "th", "thead",
        "tr", "ul",
    }
)  # fmt: skip
_ATTRIBUTES: Final = {
    "a": {"href", "title"},
    "ol": {"start"},
    "td": {"align"},
    "th": {"align"},
}
_URL_SCHEMES: Final = frozenset({"http", "https", "mailto"})

# html=False: raw HTML in the model's output is shown as text, never passed through; the
# sanitizer below is the second wall, not the only one. breaks=True: a model's line break is
# a line break (a status line per line), not the space CommonMark makes of it.
_MD: Final = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable(
    ["table", "strikethrough"]
)


def sanitize(fragment: str) -> str:
    """Keep only the allowlisted tags, attributes and URL schemes of an HTML fragment."""
    return nh3.clean(
        fragment,
        tags=set(_TAGS),
        attributes={tag: set(attrs) for tag, attrs in _ATTRIBUTES.items()},
        url_schemes=set(_URL_SCHEMES),
        link_rel="noopener noreferrer nofollow",
    )


def render_markdown(text: str) -> str:
    """The sanitized HTML of a Markdown text (an empty string for an empty text)."""
    if not text.strip():
        return ""
    return sanitize(_MD.render(text))


def prefix(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut at the last line end before ``limit`` (or at the limit in a long line),
    and whether it was cut: the part of a long output that is read as Markdown and shown (the
    parser closes whatever block the cut left open, so the HTML is whole)."""
    if len(text) <= limit:
        return text, False
    cut = text.rfind("\n", 0, limit)
    return text[: cut if cut > 0 else limit], True


def parse(text: str) -> list[Token]:
    """The token stream of a Markdown text, parsed exactly as ``render_markdown`` parses it
    (for renderers into other dialects, such as the chat channels' in ``delivery/dialects.py``)."""
    return _MD.parse(text)
