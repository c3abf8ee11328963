"""The chat channels: a Slack or Discord incoming-webhook message, or an ntfy push, per owed
notification, in the service's own payload shape and Markdown dialect, cut to its documented
length limits (split into blocks or embeds, then clipped with a link to the run), through the
guarded HTTP path of the webhook channel. The URL is the credential: it never shows in an
error.

Limits used (from the services' documentation):
- Slack: a ``section`` block's text at most 3,000 characters, at most 50 blocks, the top-level
  ``text`` (the notification's fallback) best under 4,000.
- Discord: ``content`` at most 2,000 characters; an embed's description at most 4,096, its
  title 256, all embeds of a message together 6,000, at most 10 embeds.
- ntfy: a message body up to 4,096 bytes (a longer one becomes an attachment, or is refused
  where attachments are off), so the body is kept under it.

Only a prefix of a long output is read (``SOURCE_CHARS``, cut at a line end), and each message
is made off the event loop (``delivery.rendered``).
"""

from __future__ import annotations

import json
from email.header import Header
from typing import Any

from promptsched import netguard
from promptsched.delivery import (
    REPORTS,
    DeliveryError,
    Notification,
    dialects,
    monitor_markdown,
    next_steps,
    outcome_words,
    output_text,
    rendered,
    report_lines,
    run_link,
    title,
)
from promptsched.delivery.webhook import GuardedPoster
from promptsched.domain import OutboxEvent
from promptsched.markup import prefix

# An answer that sending again cannot change: a malformed payload, a revoked or unknown hook.
_PERMANENT = frozenset({400, 401, 403, 404})

SLACK_SECTION = 3000
SLACK_OUTPUT_TOTAL = 12_000  # four sections of output, then a link
DISCORD_DESCRIPTION = 4096
DISCORD_OUTPUT_TOTAL = 5_000  # of the 6,000 all embeds may hold, leaving room for the rest
DISCORD_TITLE = 256
NTFY_MAX_BYTES = 4096  # ntfy's message limit: a longer body becomes an attachment
NTFY_BODY_BYTES = 3900  # the output's share of it, leaving room for the clip note
# The Markdown read for one message at most: four times what the longest message shows
# (Slack's 12,000 characters), so a message is as full as before and a 10 MB answer costs
# what 50,000 characters do.
SOURCE_CHARS = 50_000
_AMBER = 0xF9A825
_DISCORD_COLORS = {
    OutboxEvent.SUCCEEDED: 0x2E7D32,
    OutboxEvent.PAUSED: _AMBER,
    OutboxEvent.DIGEST: _AMBER,
    OutboxEvent.BUDGET: _AMBER,
}  # anything else (dead, escalation): red
_NTFY_TAGS = {
    OutboxEvent.SUCCEEDED: "white_check_mark",
    OutboxEvent.PAUSED: "pause_button",
    OutboxEvent.DIGEST: "warning",
    OutboxEvent.BUDGET: "money_with_wings",
}  # anything else: "x"


def _body_text(notification: Notification) -> tuple[str, bool]:
    """The Markdown the message carries (the output, or what to do next and the error), cut to
    ``SOURCE_CHARS``, and whether it was cut."""
    n = notification
    if n.succeeded:
        output, cut = prefix(output_text(n, limit=SOURCE_CHARS), SOURCE_CHARS)
        return (monitor_markdown(n) + output) or "(no output)", cut
    if n.event in REPORTS:
        return "\n".join([str(next_steps(n)), "", *report_lines(n)]), False
    error, cut = prefix(n.error or "(no error recorded)", SOURCE_CHARS)
    error = error.replace("```", "'''")
    return f"{next_steps(n)}\n\n```\n{error}\n```", cut


def _in_dialect(notification: Notification, dialect: dialects.Dialect) -> tuple[str, bool]:
    """The message's text in the chat dialect (in plain form, escaped and not read as
    Markdown), and whether the output was cut."""
    text, cut = _body_text(notification)
    if notification.plain:
        return dialect.escape(text), cut
    return dialects.render(text, dialect), cut


def _clip_note(link: str | None, dialect: dialects.Dialect) -> str:
    if link is None:
        return "… (clipped: the full text is on the run's page in the console)"
    return "… (clipped: " + dialect.link(link, "the full text is on the run's page") + ")"


def slack_payload(notification: Notification, public_url: str | None) -> dict[str, Any]:
    n = notification
    link = run_link(public_url, n)
    name = dialects.SLACK.escape(" ".join(n.key.split()))
    joiner = ":" if n.check is not None or n.event in REPORTS else ""
    bold = f"*{name}*{joiner} {dialects.SLACK.escape(outcome_words(n))}"
    headline = f"{bold} · {dialects.SLACK.escape(n.slot_text())}"
    if link:
        headline += " · " + dialects.SLACK.link(link, f"run #{n.run_id}")
    else:
        headline += f" · run #{n.run_id}"
    text, cut = _in_dialect(n, dialects.SLACK)
    pieces, clipped = dialects.split(text, SLACK_SECTION, total=SLACK_OUTPUT_TOTAL)
    clipped = clipped or cut
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": headline[:SLACK_SECTION]}}
    ]
    blocks += [{"type": "section", "text": {"type": "mrkdwn", "text": p}} for p in pieces]
    if clipped:
        note = _clip_note(link, dialects.SLACK)
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": note}]})
    # The fallback (notifications, screen readers) is mrkdwn too: escaped like the rest.
    return {"text": dialects.SLACK.escape(title(n)), "blocks": blocks}


def discord_payload(notification: Notification, public_url: str | None) -> dict[str, Any]:
    n = notification
    link = run_link(public_url, n)
    text, cut = _in_dialect(n, dialects.DISCORD)
    pieces, clipped = dialects.split(text, DISCORD_DESCRIPTION, total=DISCORD_OUTPUT_TOTAL)
    if clipped or cut:
        pieces.append(_clip_note(link, dialects.DISCORD))
    heading = title(n)[:DISCORD_TITLE]
    color = _DISCORD_COLORS.get(n.event, 0xC62828)
    embeds: list[dict[str, Any]] = []
    for index, piece in enumerate(pieces or [""]):
        embed: dict[str, Any] = {"description": piece, "color": color}
        if index == 0:
            embed["title"] = heading
            if link:
                embed["url"] = link
        embeds.append(embed)
    embeds[-1]["footer"] = {"text": f"{n.slot_text()} · run #{n.run_id}"}
    return {
        "content": "",
        "embeds": embeds,
        # The model's text must never ping a channel, a role or a person.
        "allowed_mentions": {"parse": []},
    }


def _header(text: str) -> str:
    """A header value: ASCII as it is, anything else RFC 2047-encoded (ntfy decodes it)."""
    text = " ".join(text.split())
    return text if text.isascii() else Header(text, "utf-8").encode()


def ntfy_message(
    notification: Notification, public_url: str | None
) -> tuple[bytes, dict[str, str]]:
    """The body (Markdown, which ntfy renders) and headers of an ntfy publish."""
    n = notification
    link = run_link(public_url, n)
    text, cut = _body_text(n)
    limit = NTFY_BODY_BYTES
    while True:  # characters are up to 4 bytes: shrink until the bytes fit
        pieces, clipped = dialects.split(text, limit, total=limit)
        clipped = clipped or cut
        body = (pieces[0] if pieces else "") + (
            "\n\n" + _clip_note(link, dialects.NTFY) if clipped else ""
        )
        if len(body.encode()) <= NTFY_MAX_BYTES or limit < 200:
            break
        limit = limit * NTFY_BODY_BYTES // len(body.encode()) - 50
    headers = {
        "Title": _header(title(n)[:200]),
        "Tags": _NTFY_TAGS.get(n.event, "x"),
        "Priority": "3" if n.succeeded else "4",
        "Markdown": "yes",
    }
    if link:
        headers["Click"] = link
    return (body or outcome_words(n)).encode(), headers


class _ChatSender:
    channel = ""

    def __init__(
        self, *, allow: netguard.Allowlist, timeout: float, public_url: str | None
    ) -> None:
        self.poster = GuardedPoster(self.channel, allow=allow, timeout=timeout)
        self.public_url = public_url

    def payload(self, notification: Notification) -> dict[str, Any]:
        raise NotImplementedError

    def message(self, notification: Notification) -> tuple[bytes, dict[str, str]]:
        """The request body and the headers of its own (JSON unless a channel says otherwise)."""
        body = json.dumps(self.payload(notification), ensure_ascii=False).encode()
        return body, {"Content-Type": "application/json"}

    async def send(self, notification: Notification) -> str | None:
        url = notification.chat_url
        if not url:
            raise DeliveryError(
                f"{self.channel}: the schedule has no {self.channel} URL any more "
                "(was the target removed?)",
                retryable=False,
            )
        body, own = await rendered(self.message, notification)
        headers = {
            **own,
            "User-Agent": "promptsched",
            # None of these services deduplicates on it; a receiver of our own (or a proxy) can.
            "Idempotency-Key": notification.idempotency_key,
        }
        await self.poster.post(url.reveal(), body, headers, permanent=_PERMANENT, hide=url)
        return None

    async def aclose(self) -> None:
        await self.poster.aclose()


class SlackSender(_ChatSender):
    channel = "slack"

    def payload(self, notification: Notification) -> dict[str, Any]:
        return slack_payload(notification, self.public_url)


class DiscordSender(_ChatSender):
    channel = "discord"

    def payload(self, notification: Notification) -> dict[str, Any]:
        return discord_payload(notification, self.public_url)


class NtfySender(_ChatSender):
    channel = "ntfy"

    def message(self, notification: Notification) -> tuple[bytes, dict[str, str]]:
        body, headers = ntfy_message(notification, self.public_url)
        return body, {"Content-Type": "text/markdown; charset=utf-8", **headers}
