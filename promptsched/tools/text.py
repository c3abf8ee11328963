"""Readable text from HTML with the standard library's parser: scripts, styles and other
non-content elements dropped, each block element on its own line, whitespace collapsed."""

from __future__ import annotations

import re
from html.parser import HTMLParser

# Elements whose content is never readable text.
_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "canvas", "iframe", "head"})
_BLOCK = frozenset({
    "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "figcaption",
    "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav",
    "ol", "p", "pre", "section", "table", "td", "th", "tr", "ul",
})  # fmt: skip
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "wbr"})
_SPACES = re.compile(r"[ \t\f\v\r\u00a0]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")
_WHITESPACE = re.compile(r"\s+")


class _Extractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self._skipping: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIP and tag not in _VOID:
            self._skipping.append(tag)
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if self._skipping and tag == self._skipping[-1]:
            self._skipping.pop()
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._skipping:
            self.parts.append(_WHITESPACE.sub(" ", data))


def collapse(text: str) -> str:
    """Runs of spaces to one, blank lines to one, every line trimmed."""
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()


def html_to_text(html: str) -> str:
    """The page's title (as a first line) and its readable text, one block per line."""
    parser = _Extractor()
    parser.feed(html)
    parser.close()
    body = collapse("".join(parser.parts)).replace("\n\n", "\n")
    title = " ".join("".join(parser.title).split())
    if title and not body.startswith(title):
        return f"{title}\n\n{body}" if body else title
    return body
