"""The Markdown renderer shared by the email HTML part and the console keeps structure and
drops everything active."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from promptsched.markup import render_markdown


def test_structure_survives() -> None:
    out = render_markdown("# Title\n\n**bold** and `code`\n\n|a|b|\n|-|-|\n|1|2|\n\n- x\n- y\n")
    assert "<h1>Title</h1>" in out
    assert "<strong>bold</strong>" in out and "<code>code</code>" in out
    assert "<table>" in out and "<td>1</td>" in out
    assert "<ul>" in out and "<li>x</li>" in out


@pytest.mark.parametrize(
    "hostile",
    [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        "[x](javascript:alert(1))",
        '<a href="javascript:alert(1)">x</a>',
        "![pixel](https://tracker.example/p.gif)",
        '<div style="position:fixed">x</div>',
    ],
)
def test_nothing_active_survives(hostile: str) -> None:
    out = render_markdown(f"before\n\n{hostile}\n\nafter")
    elements = _elements(out)
    assert {tag for tag, _ in elements} <= {"p", "a"}, elements
    for _tag, attrs in elements:
        for name, value in attrs:
            assert not name.startswith("on") and name != "style", (name, value)
            assert not (value or "").lower().startswith("javascript"), (name, value)
    assert "before" in out and "after" in out


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))


def _elements(fragment: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    parser = _Collect()
    parser.feed(fragment)
    return parser.found


def test_links_keep_web_schemes_only() -> None:
    out = render_markdown("[a](https://example.com) [m](mailto:a@example.com) [f](file:///etc)")
    assert 'href="https://example.com"' in out
    assert 'href="mailto:a@example.com"' in out
    hrefs = [v for _, attrs in _elements(out) for k, v in attrs if k == "href"]
    assert hrefs == ["https://example.com", "mailto:a@example.com"]
    assert 'rel="noopener noreferrer nofollow"' in out


def test_empty_text_is_empty() -> None:
    assert render_markdown("  \n") == ""
