"""RSS 2.0, RSS 1.0 (RDF) and Atom feeds parsed into their recent items, with defusedxml so
a hostile feed cannot expand entities or fetch external ones."""

from __future__ import annotations

from dataclasses import dataclass
from xml.etree.ElementTree import Element

import defusedxml.ElementTree as SafeTree
from defusedxml import DefusedXmlException

from promptsched.tools.base import ToolError
from promptsched.tools.text import collapse, html_to_text

_ATOM = "{http://www.w3.org/2005/Atom}"
_RSS1 = "{http://purl.org/rss/1.0/}"
_DC = "{http://purl.org/dc/elements/1.1/}"
SUMMARY_CHARS = 400


@dataclass(frozen=True, slots=True)
class Item:
    title: str
    link: str
    published: str
    summary: str


@dataclass(frozen=True, slots=True)
class Feed:
    title: str
    items: list[Item]


def _text(element: Element | None) -> str:
    return collapse("".join(element.itertext())) if element is not None else ""


def _summary(raw: str) -> str:
    text = " ".join(html_to_text(raw).split()) if "<" in raw else " ".join(raw.split())
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _rss_item(item: Element, ns: str = "") -> Item:
    return Item(
        title=_text(item.find(f"{ns}title")),
        link=_text(item.find(f"{ns}link")),
        published=_text(item.find("pubDate")) or _text(item.find(f"{_DC}date")),
        summary=_summary(_text(item.find(f"{ns}description"))),
    )


def _atom_link(entry: Element) -> str:
    links = entry.findall(f"{_ATOM}link")
    for link in links:
        if link.get("rel", "alternate") == "alternate" and link.get("href"):
            return link.get("href", "")
    return links[0].get("href", "") if links else ""


def _atom_entry(entry: Element) -> Item:
    summary = entry.find(f"{_ATOM}summary")
    if summary is None:
        summary = entry.find(f"{_ATOM}content")
    return Item(
        title=_text(entry.find(f"{_ATOM}title")),
        link=_atom_link(entry),
        published=_text(entry.find(f"{_ATOM}updated")) or _text(entry.find(f"{_ATOM}published")),
        summary=_summary(_text(summary)),
    )


def parse(body: bytes, limit: int) -> Feed:
    """The feed's title and its first ``limit`` items (feeds list the newest first)."""
    try:
        root = SafeTree.fromstring(body, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise ToolError(f"the feed was refused: {type(exc).__name__}") from None
    except SafeTree.ParseError as exc:
        raise ToolError(f"not a well-formed feed: {exc}") from None
    if root.tag == f"{_ATOM}feed":
        entries = [_atom_entry(e) for e in root.findall(f"{_ATOM}entry")[:limit]]
        return Feed(_text(root.find(f"{_ATOM}title")), entries)
    if root.tag == "rss":
        channel = root.find("channel")
        if channel is None:
            raise ToolError("an RSS document without a channel")
        items = [_rss_item(i) for i in channel.findall("item")[:limit]]
        return Feed(_text(channel.find("title")), items)
    if root.tag.endswith("RDF"):
        items = [_rss_item(i, _RSS1) for i in root.findall(f"{_RSS1}item")[:limit]]
        return Feed(_text(root.find(f"{_RSS1}channel/{_RSS1}title")), items)
    raise ToolError(f"not an RSS or Atom feed (root element {root.tag!r})")


def render(feed: Feed) -> str:
    """The items as numbered text for the model."""
    lines = [f"Feed: {feed.title or '(untitled)'} — {len(feed.items)} recent items"]
    for number, item in enumerate(feed.items, 1):
        lines.append(f"\n{number}. {item.title or '(untitled)'}")
        for label, value in (("link", item.link), ("published", item.published)):
            if value:
                lines.append(f"   {label}: {value}")
        if item.summary:
            lines.append(f"   {item.summary}")
    return "\n".join(lines)
