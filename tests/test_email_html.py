"""The notification email as a real SMTP server (aiosmtpd) receives it: multipart/alternative,
a text part and an HTML part rendered from the output's Markdown, sanitized (nothing active
from the model survives), styled inline, whole even when clipped; and a screenshot of the HTML
part in headless Chromium under build/screenshots/ for review."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.message import EmailMessage
from html.parser import HTMLParser
from typing import Any

import pytest

from promptsched.delivery import Notification
from promptsched.delivery.email import EmailSender, EmailSettings
from promptsched.delivery.email_html import MAX_SOURCE_CHARS
from tests.browser_support import chromium, screenshot
from tests.fakes.smtp import FakeSMTP, start_fake_smtp

SLOT = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)  # 09:00 in Paris
PUBLIC = "https://console.example.com"
HOSTILE = (
    "# Weekly digest\n\nAll **green** this week, see `make test`.\n\n"
    "| service | p95 | errors |\n|---|--:|--:|\n| api | 120 ms | 0 |\n| worker | 1.2 s | 3 |\n\n"
    "- first\n- second with [a link](https://example.com/x)\n\n"
    "```python\nprint('hello')\n```\n\n> a quote\n\n"
    "<script>alert('x')</script>\n\n<img src=x onerror=alert(1)>\n\n"
    "[click](javascript:alert(1)) and ![pixel](https://tracker.example/p.gif)\n"
)


def note(**changes: Any) -> Notification:
    values: dict[str, Any] = {
        "id": 1, "idempotency_key": "promptsched-42-succeeded-email", "channel": "email",
        "event": "succeeded", "target": ["ops@example.com"], "schedule_id": 7,
        "schedule_name": "weekly <digest>", "timezone": "Europe/Paris", "run_id": 42,
        "slot": SLOT, "origin": "cadence", "run_attempts": 2, "output": HOSTILE, "error": None,
        "finished_at": SLOT,
    }  # fmt: skip
    values.update(changes)
    return Notification(**values)


@pytest.fixture
async def smtp() -> AsyncIterator[FakeSMTP]:
    async with start_fake_smtp() as server:
        yield server


async def deliver(smtp: FakeSMTP, notification: Notification, public_url: str | None) -> Any:
    settings = EmailSettings(
        host=smtp.host, port=smtp.port, username=None, password=None, tls="none",
        sender="promptsched@example.test", timeout=5.0, public_url=public_url,
    )  # fmt: skip
    await EmailSender(settings).send(notification)
    return smtp.received[-1].message


def parts(message: EmailMessage) -> tuple[str, str]:
    assert message.get_content_type() == "multipart/alternative"
    kinds = [part.get_content_type() for part in message.iter_parts()]
    assert kinds == ["text/plain", "text/html"]
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    return str(text.get_content()), str(html.get_content())


class Structure(HTMLParser):
    """Every tag and attribute of a document, and whether each element was closed."""

    VOID = frozenset({"br", "hr", "img", "meta", "input", "link"})

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += [(name, value or "") for name, value in attrs]
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()


def structure(document: str) -> Structure:
    parser = Structure()
    parser.feed(document)
    parser.close()
    assert parser.open == [], f"left open: {parser.open}"
    return parser


async def test_a_success_mail_has_a_sanitized_styled_html_part(smtp: FakeSMTP) -> None:
    message = await deliver(smtp, note(), PUBLIC)
    text, html = parts(message)
    assert "Output:" in text and "# Weekly digest" in text  # the text part as before
    assert "Details:  https://console.example.com/runs/42" in text
    found = structure(html)
    # Structure kept: heading, table, list, code, quote, link.
    for tag in ("h1", "table", "th", "td", "ul", "li", "pre", "code", "blockquote", "a"):
        assert tag in found.tags, tag
    # Nothing active survives, whatever the model wrote.
    assert "script" not in found.tags and "img" not in found.tags
    names = {name for name, _ in found.attributes}
    assert not any(name.startswith("on") for name in names), names
    hrefs = [value for name, value in found.attributes if name == "href"]
    assert hrefs and all(h.startswith(("https://", "http://")) for h in hrefs), hrefs
    assert "tracker.example" not in html  # no remote image (tracking pixel)
    assert "[click](javascript:alert(1))" in html  # not a link: shown as the text it was
    # Styled inline, for mail clients that drop style sheets.
    assert "<style" not in html and 'class="' not in html
    assert '<td style="border:1px solid' in html
    # The schedule (escaped), the slot in the schedule's zone, the link to the run.
    assert "weekly &lt;digest&gt;" in html
    assert "2026-03-02 09:00 CET (Europe/Paris)" in html
    assert 'href="https://console.example.com/runs/42"' in html


async def test_failure_and_pause_mails_say_what_to_do_next(smtp: FakeSMTP) -> None:
    dead = note(event="dead", output=None, error="HTTP 401 <b>bad key</b>")
    text, html = parts(await deliver(smtp, dead, None))
    assert "promptsched runs replay 42" in text and "promptsched runs replay 42" in html
    assert "HTTP 401 &lt;b&gt;bad key&lt;/b&gt;" in html and "<b>" not in html
    assert "FAILED" in html and "/runs/42" not in html  # no public URL: no link
    paused = note(event="paused", output=None, error="boom")
    text, html = parts(await deliver(smtp, paused, PUBLIC))
    assert "promptsched schedules resume 7" in text and "promptsched schedules resume 7" in html
    assert "PAUSED" in str(smtp.received[-1].message["Subject"])


async def test_a_long_output_is_clipped_whole_with_a_link(smtp: FakeSMTP) -> None:
    # A code block and a table that run past the cut: the HTML must still be whole.
    long = "| a | b |\n|---|---|\n" + "| <i>x</i> | y |\n" * 3000 + "```\n" + "code\n" * 20000
    assert len(long) > MAX_SOURCE_CHARS
    _, html = parts(await deliver(smtp, note(output=long), PUBLIC))
    found = structure(html)
    assert "Clipped: the full output is on" in html
    assert html.count('href="https://console.example.com/runs/42"') >= 2
    assert "i" not in found.tags  # the model's <i> stayed text
    assert len(html) < 102_000  # under Gmail's clipping size


@pytest.mark.browser
async def test_the_html_part_renders_in_chromium(smtp: FakeSMTP) -> None:
    _, html = parts(await deliver(smtp, note(), PUBLIC))
    with chromium(javascript=False) as browser:
        browser.get("data:text/html;base64," + base64.b64encode(html.encode()).decode())
        heading = browser.find_element("css selector", "h1").text
        assert heading == "weekly <digest>"
        cells = [c.text for c in browser.find_elements("css selector", "td td, td th")]
        assert "worker" in cells and "1.2 s" in cells
        path = screenshot(browser, "email-html-success")
        dead = note(event="dead", output=None, error="provider answered HTTP 429 three times")
        _, failed = parts(await deliver(smtp, dead, PUBLIC))
        browser.get("data:text/html;base64," + base64.b64encode(failed.encode()).decode())
        screenshot(browser, "email-html-dead")
    assert path.stat().st_size > 10_000
