"""The HTML part of a notification email: the output's Markdown rendered and sanitized by
``promptsched/markup.py``, styled inline (mail clients drop ``<style>`` sheets and classes),
with the schedule, the slot in the schedule's zone, what to do next after a failure or a pause,
and a link to the run when ``PROMPTSCHED_PUBLIC_URL`` is set.

A long output is cut in its Markdown source at a line end before rendering, so the HTML is
always whole (the parser closes whatever block the cut left open), and a note with the link
says where the rest is. In plain form (``Notification.plain``) the cut source is shown as
text, unread.
"""

from __future__ import annotations

import html as htmllib
import re

from promptsched import markup
from promptsched.delivery import (
    REPORTS,
    Notification,
    monitor_markdown,
    next_steps,
    outcome_words,
    output_text,
    report_lines,
    run_link,
)

# The Markdown source rendered at most; beyond it, the note and the link.
MAX_SOURCE_CHARS = 60_000
# The rendered output at most: Gmail clips a message whose HTML passes 102 KB (inline styles
# make a long table heavy), so a heavier rendering is cut shorter in its source.
MAX_HTML_CHARS = 90_000

_FONT = "font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"
_MONO = "font-family:SFMono-Regular,Consolas,'Liberation Mono',Menlo,monospace"
# One inline style per tag the sanitizer lets through.
STYLES = {
    "h1": "font-size:22px;margin:20px 0 10px;color:#1f2328",
    "h2": "font-size:19px;margin:18px 0 8px;color:#1f2328",
    "h3": "font-size:16px;margin:16px 0 6px;color:#1f2328",
    "h4": "font-size:15px;margin:14px 0 6px", "h5": "font-size:14px;margin:12px 0 6px",
    "h6": "font-size:13px;margin:12px 0 6px;color:#59636e",
    "p": "margin:0 0 12px;line-height:1.5",
    "a": "color:#0969da",
    "ul": "margin:0 0 12px;padding-left:24px", "ol": "margin:0 0 12px;padding-left:24px",
    "li": "margin:2px 0;line-height:1.5",
    "blockquote": "margin:0 0 12px;padding:0 12px;border-left:4px solid #d1d9e0;color:#59636e",
    "pre": f"{_MONO};font-size:13px;background:#f6f8fa;padding:12px;border-radius:6px;"
           "overflow:auto;white-space:pre-wrap;word-wrap:break-word;margin:0 0 12px",
    "code": f"{_MONO};font-size:13px;background:#f6f8fa;padding:1px 4px;border-radius:4px",
    "table": "border-collapse:collapse;margin:0 0 12px;font-size:14px",
    "th": "border:1px solid #d1d9e0;padding:6px 10px;background:#f6f8fa;text-align:left",
    "td": "border:1px solid #d1d9e0;padding:6px 10px",
    "hr": "border:0;border-top:1px solid #d1d9e0;margin:16px 0",
}  # fmt: skip
_TAG = re.compile(r"<(" + "|".join(STYLES) + r")(?=[\s>/])")
_COLORS = {"succeeded": "#1a7f37", "paused": "#9a6700", "digest": "#9a6700", "budget": "#9a6700"}
_FAILED = "#cf222e"


def styled(fragment: str) -> str:
    """The sanitized fragment with each tag's inline style (the sanitizer left no ``style``
    attribute to collide with)."""
    return _TAG.sub(lambda m: f'<{m.group(1)} style="{STYLES[m.group(1)]}"', fragment)


def clip_source(text: str, limit: int = MAX_SOURCE_CHARS) -> tuple[str, bool]:
    """``text`` cut at the last line end before ``limit`` (or at the limit in a long line)."""
    return markup.prefix(text, limit)


def _esc(text: str) -> str:
    return htmllib.escape(text, quote=True)


def _link(href: str, text: str) -> str:
    return f'<a href="{_esc(href)}" style="{STYLES["a"]}">{_esc(text)}</a>'


def _steps(n: Notification) -> str:
    """What to do now, its commands as code (the sentence is Markdown, sanitized)."""
    return styled(markup.render_markdown(next_steps(n) or ""))


def _content(n: Notification, link: str | None) -> str:
    if n.event in REPORTS:
        steps = _steps(n)
        first, *items = report_lines(n)
        rows = "".join(
            f'<li style="{STYLES["li"]}">{_esc(i.removeprefix("- "))}</li>' for i in items
        )
        return (
            steps
            + f'<p style="{STYLES["p"]}">{_esc(first)}</p><ul style="{STYLES["ul"]}">{rows}</ul>'
        )
    if not n.succeeded:
        steps = _steps(n)
        error, clipped = clip_source(n.error or "(no error recorded)")
        more = "\n[… clipped]" if clipped else ""
        return steps + f'<pre style="{STYLES["pre"]}">{_esc(error + more)}</pre>'
    # Only a prefix of the output is ever read, whatever its size.
    output, cut = markup.prefix(output_text(n, limit=MAX_SOURCE_CHARS), MAX_SOURCE_CHARS)
    whole = monitor_markdown(n) + output
    limit = MAX_SOURCE_CHARS
    while True:  # at most a few rounds: each cuts the source to well under the last
        source, clipped = clip_source(whole, limit)
        clipped = clipped or cut
        if n.plain:
            rendered = f'<pre style="{STYLES["pre"]}">{_esc(source)}</pre>'
        else:
            rendered = styled(markup.render_markdown(source))
        if len(rendered) <= MAX_HTML_CHARS or limit < 1000:
            break
        limit = int(len(source) * MAX_HTML_CHARS / len(rendered) * 0.9)
    rendered = rendered or f'<p style="{STYLES["p"]}">(empty)</p>'
    if clipped:
        where = (
            f"the full output is on {_link(link, 'the run page')}"
            if link
            else ("the full output is on the run's page in the console")
        )
        rendered += f'<p style="{STYLES["p"]};color:#59636e"><em>Clipped: {where}.</em></p>'
    return rendered


def html(notification: Notification, public_url: str | None) -> str:
    """The whole HTML document of the email."""
    n = notification
    link = run_link(public_url, n)
    color = _COLORS.get(n.event, _FAILED)
    run = _link(link, f"run #{n.run_id}") if link else f"run #{n.run_id}"
    facts = (
        f"{_esc(n.slot_text())} · {run} · {_esc(n.origin)}, "
        f"{n.run_attempts} attempt{'s' if n.run_attempts != 1 else ''}"
    )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width"></head>'
        f'<body style="margin:0;padding:0;background:#f6f8fa;{_FONT};color:#1f2328">'
        '<table role="presentation" width="100%" cellpadding="0" cellspacing="0" '
        'style="background:#f6f8fa"><tr><td style="padding:24px 12px">'
        '<table role="presentation" width="100%" cellpadding="0" cellspacing="0" '
        'style="max-width:680px;margin:0 auto;background:#ffffff;border:1px solid #d1d9e0;'
        f'border-top:4px solid {color};border-radius:6px"><tr><td style="padding:20px 24px">'
        f'<p style="margin:0 0 4px;font-size:13px;color:{color};font-weight:600">'
        f"{_esc(outcome_words(n))}</p>"
        f'<h1 style="font-size:20px;margin:0 0 6px">{_esc(n.key)}</h1>'
        f'<p style="margin:0 0 16px;font-size:13px;color:#59636e">{facts}</p>'
        f'<div style="font-size:15px">{_content(n, link)}</div>'
        "</td></tr></table>"
        '<p style="max-width:680px;margin:12px auto 0;font-size:12px;color:#59636e">'
        f"Sent by promptsched for schedule #{n.schedule_id}.</p>"
        "</td></tr></table></body></html>"
    )
