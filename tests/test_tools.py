"""The built-in read-only tools against a local web site: readable text from HTML, feeds,
size caps, the network guard (with the tools' own allowlist), and the tool catalog's rules."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from promptsched import netguard
from promptsched.errors import RetryableError, ValidationError
from promptsched.tools import builtin, feeds
from promptsched.tools.base import Catalog, ToolError
from promptsched.tools.registry import ToolRegistry
from promptsched.tools.settings import McpSettings
from promptsched.tools.text import html_to_text
from tests.fakes import pages as site

LOOPBACK = netguard.Allowlist.parse("127.0.0.1", variable=netguard.TOOLS_ALLOW)


@pytest.fixture
async def tools() -> AsyncIterator[builtin.Builtins]:
    found = builtin.Builtins(allow=LOOPBACK)  # the local site is on loopback
    yield found
    await found.aclose()


def test_html_to_text_drops_scripts_styles_and_markup_and_collapses_whitespace() -> None:
    text = html_to_text(site.PAGE)
    assert text.splitlines()[:3] == ["Harbour weather", "", "Home | About"]
    assert "Forecast\nSunny and warm, wind 3 knots." in text
    assert "Tide: high at 09:12\nTide: low at 15:40" in text
    for hidden in ("secret", "color: red", "enable javascript", "<p>"):
        assert hidden not in text
    assert "  " not in text and "\n\n\n" not in text
    assert html_to_text("<div>a  b\n c</div><p>x</p>") == "a b c\nx"


async def test_http_get_returns_the_readable_text_of_a_page(
    pages: site.Pages, tools: builtin.Builtins
) -> None:
    result = await tools.tools["http_get"].call({"url": pages.url("/page")})
    assert result.startswith(f"URL: {pages.url('/page')}\n\nHarbour weather")
    assert "Sunny and warm" in result and "secret" not in result


async def test_http_get_caps_the_download_and_the_result(
    pages: site.Pages, tools: builtin.Builtins
) -> None:
    result = await tools.tools["http_get"].call({"url": pages.url("/big")})
    assert len(result) < builtin.MAX_RESULT_CHARS + 100
    assert result.endswith("more characters cut]")


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/status/500", "HTTP 500"),
        ("/binary", "image/png is not text"),
        ("/redirect?to=ftp://example.com/x", "only http and https URLs"),
    ],
)
async def test_http_get_failures_are_tool_errors(
    pages: site.Pages, tools: builtin.Builtins, path: str, error: str
) -> None:
    with pytest.raises(ToolError, match=error.replace("?", r"\?")):
        await tools.tools["http_get"].call({"url": pages.url(path)})


async def test_http_get_follows_a_redirect_to_an_allowed_page(
    pages: site.Pages, tools: builtin.Builtins
) -> None:
    result = await tools.tools["http_get"].call(
        {"url": pages.url(f"/redirect?to={pages.url('/page')}")}
    )
    assert "Harbour weather" in result
    assert pages.paths[-1] == "/page"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({}, "'url' must be a non-empty string"),
        ({"url": "file:///etc/passwd"}, "only http and https"),
        ({"url": "http://user:pw@example.com/"}, "credentials"),
    ],
)
async def test_http_get_rejects_bad_arguments(
    tools: builtin.Builtins, arguments: dict[str, str], error: str
) -> None:
    with pytest.raises(ToolError, match=error):
        await tools.tools["http_get"].call(arguments)


async def test_the_address_guard_refuses_loopback_unless_the_tools_allowlist_covers_it(
    pages: site.Pages,
) -> None:
    guarded = builtin.Builtins(allow=netguard.NO_TOOLS_ALLOW)
    try:
        # Checked before any connection (redirect hops go through the same check).
        for url, rule in [
            ("http://10.1.2.3/", "10.1.2.3 is private and not in PROMPTSCHED_TOOLS_ALLOW"),
            ("http://[::1]/", "::1 is loopback and not in PROMPTSCHED_TOOLS_ALLOW"),
            ("http://169.254.169.254/latest", "169.254.169.254 is a cloud metadata address"),
        ]:
            with pytest.raises(ToolError, match=re.escape(rule)):
                guarded.fetcher.check(url)
        message = "127.0.0.1 is loopback and not in PROMPTSCHED_TOOLS_ALLOW"
        with pytest.raises(ToolError, match=message):
            await guarded.tools["http_get"].call({"url": pages.url("/page")})
        with pytest.raises(ToolError, match="localhost is a loopback name and not in"):
            await guarded.tools["rss"].call({"url": "http://localhost/feed"})
    finally:
        await guarded.aclose()
    assert pages.paths == []  # nothing was ever sent


async def test_rss_lists_the_recent_items_of_rss_and_atom_feeds(
    pages: site.Pages, tools: builtin.Builtins
) -> None:
    rss = await tools.tools["rss"].call({"url": pages.url("/feed.xml"), "limit": 2})
    assert rss.splitlines()[0] == "Feed: Port news — 2 recent items"
    assert "1. Ferry delayed\n   link: https://example.com/ferry\n" in rss
    assert "The morning ferry is late." in rss
    assert "2. New pier" in rss and "Old news" not in rss
    atom = await tools.tools["rss"].call({"url": pages.url("/atom.xml")})
    assert "1. Crane repaired\n   link: https://example.com/crane" in atom
    assert "published: 2026-03-01T10:00:00Z" in atom and "Back in service." in atom


async def test_rss_refuses_a_document_type_declaration(
    pages: site.Pages, tools: builtin.Builtins
) -> None:
    with pytest.raises(ToolError, match="refused: DTDForbidden"):
        await tools.tools["rss"].call({"url": pages.url("/bomb.xml")})
    with pytest.raises(ToolError, match="not an RSS or Atom feed"):
        feeds.parse(b"<html><body/></html>", 5)
    with pytest.raises(ToolError, match="between 1 and 50"):
        await tools.tools["rss"].call({"url": pages.url("/feed.xml"), "limit": 500})


def test_the_catalog_names_unknown_and_refused_tools() -> None:
    catalog = Catalog(
        {"http_get": None, "kb.write": "tool 'kb.write' is not marked read-only"},
        unavailable={"down": "ConnectionRefusedError"},
    )
    catalog.check(["http_get"])
    with pytest.raises(ValidationError) as unknown:
        catalog.check(["http_get", "nope"])
    assert unknown.value.field == "params.tools[1]"
    assert "unknown tool 'nope'; available: http_get, kb.write" in unknown.value.message
    with pytest.raises(ValidationError, match="not marked read-only"):
        catalog.check(["kb.write"])
    with pytest.raises(ValidationError, match="MCP server 'down' is not connected"):
        catalog.check(["down.search"])


async def test_the_registry_offers_the_builtins_and_waits_for_disconnected_servers() -> None:
    down = McpSettings("down", url="http://127.0.0.1:9/mcp", timeout=timedelta(seconds=1))
    registry = ToolRegistry.from_settings(allow=netguard.NO_TOOLS_ALLOW, mcp={"down": down})
    try:
        catalog = registry.catalog()
        assert catalog.tools == {"http_get": None, "rss": None}
        assert set(catalog.unavailable) == {"down"}
        assert [tool.name for tool in registry.resolve(["rss", "http_get"])] == ["rss", "http_get"]
        with pytest.raises(RetryableError, match="MCP server 'down' is not connected"):
            registry.resolve(["down.search"])
        with pytest.raises(ValidationError, match="unknown tool 'nope'"):
            registry.resolve(["nope"])
    finally:
        await registry.aclose()
