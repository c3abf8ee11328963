"""A local web site for the agent's built-in tools: an HTML page with script and style, an
RSS and an Atom feed, errors, redirects, a page that never answers, a large page and a
binary one. Every request's path is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from tests.fakes import serve

PAGE = """<!doctype html>
<html><head><title>Harbour weather</title>
<style>body { color: red }</style>
<script>var secret = "do not read me";</script></head>
<body><nav>Home | About</nav>
<h1>Forecast</h1>
<p>Sunny   and
   warm, wind 3&nbsp;knots.</p>
<noscript>enable javascript</noscript>
<ul><li>Tide: high at 09:12</li><li>Tide: low at 15:40</li></ul>
</body></html>"""

RSS = """<?xml version="1.0"?>
<rss version="2.0"><channel><title>Port news</title>
<item><title>Ferry delayed</title><link>https://example.com/ferry</link>
<pubDate>Mon, 02 Mar 2026 08:00:00 GMT</pubDate>
<description>&lt;p&gt;The &lt;b&gt;morning&lt;/b&gt; ferry is late.&lt;/p&gt;</description></item>
<item><title>New pier</title><link>https://example.com/pier</link></item>
<item><title>Old news</title><link>https://example.com/old</link></item>
</channel></rss>"""

ATOM = """<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><title>Harbour log</title>
<entry><title>Crane repaired</title><link rel="alternate" href="https://example.com/crane"/>
<updated>2026-03-01T10:00:00Z</updated><summary>Back in service.</summary></entry>
</feed>"""

BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;">]>
<rss version="2.0"><channel><title>&lol2;</title></channel></rss>"""


@dataclass
class Pages:
    base_url: str = ""
    paths: list[str] = field(default_factory=list)
    hanging: int = 0
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def wait_hanging(self, count: int = 1) -> None:
        while self.hanging < count:
            changed = self._changed
            await changed.wait()

    def _touch(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path_qs)
        self._touch()
        path = request.path
        if path == "/page":
            return web.Response(text=PAGE, content_type="text/html")
        if path in ("/feed.xml", "/atom.xml", "/bomb.xml"):
            body = {"/feed.xml": RSS, "/atom.xml": ATOM, "/bomb.xml": BOMB}[path]
            return web.Response(text=body, content_type="application/rss+xml")
        if path.startswith("/status/"):
            return web.Response(status=int(path.rsplit("/", 1)[1]), text="nope")
        if path == "/redirect":
            raise web.HTTPFound(request.query["to"])
        if path == "/big":
            return web.Response(text="<p>" + "word " * 1_000_000 + "</p>", content_type="text/html")
        if path == "/binary":
            return web.Response(body=b"\x89PNG....", content_type="image/png")
        if path == "/hang":
            self.hanging += 1
            self._touch()
            await self._closing.wait()
            return web.Response(status=503)
        return web.Response(status=404, text="not here")


@asynccontextmanager
async def start_pages() -> AsyncIterator[Pages]:
    pages = Pages()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", pages.handle)
    async with serve(app, release=pages._closing, shutdown_timeout=1.0) as base_url:
        pages.base_url = base_url
        yield pages
