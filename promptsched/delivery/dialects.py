"""Model output (CommonMark) rewritten in a chat service's own Markdown dialect, and cut into
pieces that fit the service's length limits without breaking a code block.

The text is parsed once by the parser of ``promptsched/markup.py`` and each token rendered in
the dialect: Slack's mrkdwn (``*bold*``, ``<url|text>``, ``&``/``<``/``>`` escaped) or Discord's
Markdown (``**bold**``, ``[text](url)``). Neither service draws tables, so a table becomes an
aligned code block.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from markdown_it.token import Token

from promptsched import markup

FENCE = "```"


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    strong: str
    em: str
    strike: str
    escape: Callable[[str], str]
    link: Callable[[str, str], str]
    heading: Callable[[str, int], str]
    code_escape: Callable[[str], str] = field(default=lambda text: text)


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_link(href: str, text: str) -> str:
    href = href.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C")
    return f"<{href}|{text}>" if text and text != href else f"<{href}>"


_DISCORD_SPECIAL = re.compile(r"([\\*_~`|\[\]<>#@])")


def _discord_escape(text: str) -> str:
    return _DISCORD_SPECIAL.sub(r"\\\1", text)


def _discord_href(href: str) -> str:
    # Inside <...>, only '>' (and a line break, which a parsed link cannot hold) ends it.
    return href.replace(">", "%3E").replace("<", "%3C")


def _discord_code(text: str) -> str:
    # A literal ``` inside a code block would close it early.
    return text.replace(FENCE, "`\u200b``")


SLACK = Dialect(
    name="slack",
    strong="*",
    em="_",
    strike="~",
    escape=_slack_escape,
    link=_slack_link,
    heading=lambda text, level: f"*{text}*",
    code_escape=_slack_escape,
)
DISCORD = Dialect(
    name="discord",
    strong="**",
    em="*",
    strike="~~",
    escape=_discord_escape,
    link=lambda href, text: f"[{text or href}](<{_discord_href(href)}>)",
    heading=lambda text, level: f"{'#' * min(level, 3)} {text}",
    code_escape=_discord_code,
)


# ntfy renders CommonMark itself: the text goes as written (the parser's reading is only
# needed for splitting), and links in our own notes are CommonMark links.
NTFY = Dialect(
    name="ntfy",
    strong="**",
    em="*",
    strike="~~",
    escape=lambda text: text,
    link=lambda href, text: f"[{text or href}](<{_discord_href(href)}>)",
    heading=lambda text, level: f"{'#' * level} {text}",
)


def _inline(tokens: list[Token], dialect: Dialect) -> str:
    out: list[str] = []
    hrefs: list[str] = []
    link_text: list[list[str]] = []
    for token in tokens:
        target = link_text[-1] if link_text else out
        kind = token.type
        if kind == "text":
            target.append(dialect.escape(token.content))
        elif kind in ("softbreak", "hardbreak"):
            target.append("\n")
        elif kind == "code_inline":
            code = dialect.code_escape(token.content.replace("`", "'"))
            target.append(f"`{code}`")
        elif kind in ("strong_open", "strong_close"):
            target.append(dialect.strong)
        elif kind in ("em_open", "em_close"):
            target.append(dialect.em)
        elif kind in ("s_open", "s_close"):
            target.append(dialect.strike)
        elif kind == "link_open":
            hrefs.append(str(token.attrGet("href") or ""))
            link_text.append([])
        elif kind == "link_close" and link_text:
            text, href = "".join(link_text.pop()), hrefs.pop()
            holder = link_text[-1] if link_text else out
            safe = href.startswith(("http://", "https://", "mailto:"))
            holder.append(dialect.link(href, text) if safe else text)
        elif kind == "image":
            target.append(dialect.escape(token.content or "image"))
    return "".join(out)


def _table(rows: list[list[str]], dialect: Dialect) -> str:
    widths = [max(len(row[i]) if i < len(row) else 0 for row in rows) for i in range(len(rows[0]))]
    lines = [
        " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    if len(lines) > 1:
        lines.insert(1, "-+-".join("-" * w for w in widths))
    return f"{FENCE}\n{dialect.code_escape(chr(10).join(lines))}\n{FENCE}"


class _Writer:
    """Blocks in order, with the prefixes of the lists and quotes they sit in."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.blocks: list[tuple[str, bool]] = []  # (text, inside a list)
        self.quote = 0
        self.lists: list[list[int]] = []  # one [next number] (or [-1]: bullets) per level
        self.marker: str | None = None
        self.table: list[list[str]] | None = None

    def add(self, text: str) -> None:
        indent = "   " * max(0, len(self.lists) - 1)
        first = indent + (self.marker if self.marker is not None else ("   " if self.lists else ""))
        rest = indent + ("   " if self.lists else "")
        self.marker = None
        lines = text.split("\n")
        shaped = [first + lines[0]] + [rest + line for line in lines[1:]]
        prefix = "> " * self.quote
        self.blocks.append(("\n".join(prefix + line for line in shaped), bool(self.lists)))

    def token(self, token: Token) -> None:
        if not self._structure(token):
            self._content(token)
        self.heading = int(token.tag[1]) if token.type == "heading_open" else 0

    def _structure(self, token: Token) -> bool:
        """Quotes, lists and tables opening and closing; False for any other token."""
        kind = token.type
        if kind in ("blockquote_open", "blockquote_close"):
            self.quote += 1 if kind.endswith("open") else -1
        elif kind in ("bullet_list_open", "ordered_list_open"):
            start = token.attrGet("start")
            self.lists.append([int(start) if start else 1] if kind[0] == "o" else [-1])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            self.lists.pop()
        elif kind == "list_item_open" and self.lists:
            number = self.lists[-1]
            self.marker = "• " if number[0] < 0 else f"{number[0]}. "
            if number[0] >= 0:
                number[0] += 1
        elif kind == "table_open":
            self.table = []
        elif kind == "tr_open" and self.table is not None:
            self.table.append([])
        elif kind == "table_close" and self.table:
            self.add(_table(self.table, self.dialect))
            self.table = None
        else:
            return False
        return True

    def _content(self, token: Token) -> None:
        kind = token.type
        if kind == "inline":
            text = _inline(token.children or [], self.dialect)
            if self.table:
                self.table[-1].append(" ".join(text.split()))
            elif self.heading:
                self.add(self.dialect.heading(text, self.heading))
            else:
                self.add(text)
        elif kind in ("fence", "code_block"):
            self.add(f"{FENCE}\n{self.dialect.code_escape(token.content.rstrip())}\n{FENCE}")
        elif kind == "hr":
            self.add("───")

    heading = 0


def render(text: str, dialect: Dialect) -> str:
    """``text`` (CommonMark) in the chat dialect."""
    writer = _Writer(dialect)
    for token in markup.parse(text):
        writer.token(token)
    out: list[str] = []
    previous_in_list = False
    for text_block, in_list in writer.blocks:
        if out:
            out.append("\n" if in_list and previous_in_list else "\n\n")
        out.append(text_block)
        previous_in_list = in_list
    return "".join(out)


def split(text: str, size: int, *, total: int) -> tuple[list[str], bool]:
    """``text`` in pieces of at most ``size`` characters, cut at line ends (a longer line is
    cut inside), never leaving a code block open across a cut (it is closed at the end of one
    piece and opened again at the start of the next), and at most ``total`` characters in
    all. Returns the pieces and whether anything was left out."""
    room = size - 2 * (len(FENCE) + 1)  # each piece may need a fence opened and closed
    lines: list[str] = []
    for line in text.split("\n"):
        lines.extend(line[i : i + room] for i in range(0, max(len(line), 1), room))
    pieces: list[str] = []
    current: list[str] = []
    in_fence = False
    for line in lines:
        if current and len("\n".join([*current, line])) > room:
            pieces.append("\n".join(current) + (f"\n{FENCE}" if in_fence else ""))
            current = [FENCE] if in_fence else []
        current.append(line)
        if line.lstrip().startswith(FENCE):
            in_fence = not in_fence
    if any(part.strip() and part != FENCE for part in current):
        pieces.append("\n".join(current) + (f"\n{FENCE}" if in_fence else ""))
    kept: list[str] = []
    used = 0
    for piece in pieces:
        if used + len(piece) > total:
            break
        kept.append(piece)
        used += len(piece)
    return kept, len(kept) < len(pieces)
