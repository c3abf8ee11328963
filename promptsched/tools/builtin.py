"""The built-in read-only tools: ``http_get`` (a page's readable text) and ``rss`` (a feed's
recent items). Both fetch through the network guard, with caps on download and result size."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from promptsched import netguard
from promptsched.tools import feeds
from promptsched.tools.base import Tool, ToolError, clip, int_argument, string_argument
from promptsched.tools.fetch import Fetched, Fetcher
from promptsched.tools.text import collapse, html_to_text

MAX_DOWNLOAD_BYTES = 2 * 1024 * 1024
MAX_RESULT_CHARS = 12_000
FETCH_TIMEOUT = 20.0
_TEXTUAL = ("text/", "application/json", "application/xml", "application/xhtml+xml")
_FEED_TYPES = "application/rss+xml, application/atom+xml, application/xml;q=0.9, */*;q=0.5"


def _schema(properties: Mapping[str, Any], required: tuple[str, ...]) -> Mapping[str, Any]:
    return MappingProxyType({
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    })  # fmt: skip


def readable(page: Fetched) -> str:
    """A fetched page as text: HTML reduced to its readable text, JSON and text as they are."""
    kind = page.content_type.lower()
    if not kind.startswith(_TEXTUAL) and kind != "application/octet-stream":
        raise ToolError(f"{page.url}: {kind} is not text (only HTML, text and JSON are read)")
    raw = page.text()
    if "html" in kind or raw.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        text = html_to_text(raw)
    elif kind == "application/json":
        try:
            text = json.dumps(json.loads(raw), indent=1, ensure_ascii=False)
        except ValueError:
            text = raw
    else:
        text = collapse(raw)
    note = f"\n[the page was cut at {MAX_DOWNLOAD_BYTES} bytes]" if page.truncated else ""
    return f"URL: {page.url}\n\n{text}{note}"


class HttpGet:
    name = "http_get"
    description = (
        "Fetch a web page (http or https) and return its readable text (scripts, styles and "
        f"markup removed; at most {MAX_RESULT_CHARS} characters)."
    )
    parameters = _schema({"url": {"type": "string", "description": "the URL to fetch"}}, ("url",))
    read_only = True

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher

    async def call(self, arguments: Mapping[str, Any]) -> str:
        url = string_argument(arguments, "url")
        page = await self._fetcher.get(url, accept="text/html, text/*;q=0.9, */*;q=0.5")
        return clip(readable(page), MAX_RESULT_CHARS)


class Rss:
    name = "rss"
    description = (
        "Read an RSS or Atom feed and return its most recent items (title, link, date and a "
        "short summary of each)."
    )
    parameters = _schema(
        {
            "url": {"type": "string", "description": "the feed's URL"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        },
        ("url",),
    )
    read_only = True

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher

    async def call(self, arguments: Mapping[str, Any]) -> str:
        url = string_argument(arguments, "url")
        limit = int_argument(arguments, "limit", 10, 1, 50)
        page = await self._fetcher.get(url, accept=_FEED_TYPES)
        if page.truncated:
            raise ToolError(f"{page.url}: the feed is larger than {MAX_DOWNLOAD_BYTES} bytes")
        return clip(feeds.render(feeds.parse(page.body, limit)), MAX_RESULT_CHARS)


class Builtins:
    """The built-in tools of one process, sharing one guarded HTTP session."""

    def __init__(self, *, allow: netguard.Allowlist) -> None:
        self.fetcher = Fetcher(allow=allow, max_bytes=MAX_DOWNLOAD_BYTES, timeout=FETCH_TIMEOUT)
        self.tools: dict[str, Tool] = {
            tool.name: tool for tool in (HttpGet(self.fetcher), Rss(self.fetcher))
        }

    async def aclose(self) -> None:
        await self.fetcher.aclose()
