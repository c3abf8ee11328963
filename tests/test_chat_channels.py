"""Slack and Discord incoming webhooks as notify targets, against real Postgres and fake
Slack/Discord endpoints on loopback: the payload shapes, the dialects, the length limits, the
URL kept secret, permanent and retryable answers, and the re-send after a SIGKILL between send
and mark. Plus the Standard Webhooks signature, checked by the `standardwebhooks` package."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import standardwebhooks

from promptsched.clock import FrozenClock
from promptsched.config import NotifierSettings
from promptsched.delivery import DeliveryError, Notification, dialects
from promptsched.delivery.chat import (
    DISCORD_DESCRIPTION,
    SLACK_SECTION,
    DiscordSender,
    NtfySender,
    SlackSender,
    discord_payload,
    ntfy_message,
    slack_payload,
)
from promptsched.delivery.webhook import WebhookSender, standard_secret
from promptsched.errors import ValidationError
from promptsched.metrics import Metrics
from promptsched.ops import notify_targets, views
from promptsched.roles.notifier import Notifier
from promptsched.secret import Secret
from promptsched.store import queries
from tests import factories
from tests.factories import EPOCH
from tests.fakes.http_sink import HttpSink, Reply
from tests.test_notifier import LOOPBACK, crash_between_send_and_mark, outbox

SLOT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
PUBLIC = "https://console.example.com/"
# A long answer: headings, a table, prose and a code block far beyond every chat limit.
LONG = "\n\n".join(
    ["# Weekly report", "| team | tickets |\n|---|---|\n| core | 12 |\n| web | 7 |"]
    + [f"Paragraph {i}: " + "words and more words " * 20 for i in range(60)]
    + ["```python\n" + "\n".join(f"print({i})  # a line of code" for i in range(400)) + "\n```"]
)


def note(channel: str, url: str, **changes: Any) -> Notification:
    values: dict[str, Any] = {
        "id": 1, "idempotency_key": f"promptsched-42-succeeded-{channel}", "channel": channel,
        "event": "succeeded", "target": {"host": "127.0.0.1"}, "schedule_id": 7,
        "schedule_name": "daily <digest> & co", "timezone": "Europe/Paris", "run_id": 42,
        "slot": SLOT, "origin": "cadence", "run_attempts": 1, "output": "**done**",
        "error": None, "finished_at": SLOT, "chat_url": Secret(url),
    }  # fmt: skip
    values.update(changes)
    return Notification(**values)


def slack_limits_hold(payload: dict[str, Any]) -> None:
    blocks = payload["blocks"]
    assert 1 <= len(blocks) <= 50
    assert len(payload["text"]) <= 4000
    for block in blocks:
        texts = [block["text"]] if "text" in block else block["elements"]
        for text in texts:
            assert text["type"] == "mrkdwn" and len(text["text"]) <= SLACK_SECTION


def discord_limits_hold(payload: dict[str, Any]) -> None:
    embeds = payload["embeds"]
    assert len(payload["content"]) <= 2000 and 1 <= len(embeds) <= 10
    total = 0
    for embed in embeds:
        assert len(embed["description"]) <= DISCORD_DESCRIPTION
        assert len(embed.get("title", "")) <= 256
        total += len(embed["description"]) + len(embed.get("title", ""))
        total += len(embed.get("footer", {}).get("text", ""))
    assert total <= 6000
    assert payload["allowed_mentions"] == {"parse": []}


def fences_balanced(text: str) -> bool:
    return sum(line.lstrip().startswith("```") for line in text.split("\n")) % 2 == 0


def test_slack_speaks_mrkdwn_and_discord_its_markdown() -> None:
    text = "# Title\n\n**bold** _it_ ~~gone~~ <b>&</b> [site](https://example.com/a)\n\n- a\n- b"
    slack = dialects.render(text, dialects.SLACK)
    assert slack.splitlines()[0] == "*Title*"
    assert "*bold* _it_ ~gone~ &lt;b&gt;&amp;&lt;/b&gt; <https://example.com/a|site>" in slack
    assert "• a\n• b" in slack
    discord = dialects.render(text, dialects.DISCORD)
    assert discord.splitlines()[0] == "# Title"
    assert "**bold** *it* ~~gone~~ \\<b\\>&\\</b\\> [site](<https://example.com/a>)" in discord
    # Neither draws tables: a table becomes an aligned code block.
    table = dialects.render("|a|bb|\n|-|-|\n|1|2|", dialects.SLACK)
    assert table == "```\na | bb\n--+---\n1 | 2\n```"
    # A link to something that is not the web is text, not a link.
    assert "<" not in dialects.render("[x](ftp://example.com)", dialects.SLACK)


def test_long_outputs_are_split_within_each_limit_and_clipped_with_a_link() -> None:
    slack = slack_payload(note("slack", "http://x", output=LONG), PUBLIC)
    slack_limits_hold(slack)
    sections = [b["text"]["text"] for b in slack["blocks"] if b["type"] == "section"]
    assert len(sections) > 3, "the output was split over several sections"
    assert all(fences_balanced(s) for s in sections), "no section leaves a code block open"
    assert "*Weekly report*" in sections[1]
    context = slack["blocks"][-1]
    assert context["type"] == "context"
    assert "<https://console.example.com/runs/42|" in context["elements"][0]["text"]
    assert "<https://console.example.com/runs/42|run #42>" in sections[0]
    assert "daily &lt;digest&gt; &amp; co" in sections[0]
    assert slack["text"] == "daily &lt;digest&gt; &amp; co succeeded"

    discord = discord_payload(note("discord", "http://x", output=LONG), PUBLIC)
    discord_limits_hold(discord)
    assert len(discord["embeds"]) >= 2
    assert discord["embeds"][0]["url"] == "https://console.example.com/runs/42"
    assert all(fences_balanced(e["description"]) for e in discord["embeds"])
    assert "(<https://console.example.com/runs/42>)" in discord["embeds"][-1]["description"]
    # Short outputs are neither split nor clipped.
    short = slack_payload(note("slack", "http://x"), None)
    assert [b["type"] for b in short["blocks"]] == ["section", "section"]
    assert short["blocks"][1]["text"]["text"] == "*done*"


def test_an_ntfy_push_fits_its_limit_and_encodes_its_title() -> None:
    # Two bytes a character (the limit is in bytes), and a code block cut by the limit.
    wide = "Größe " * 600 + "\n```\n" + "ü\n" * 3000 + "```"
    body, headers = ntfy_message(
        note("ntfy", "http://x", output=wide, schedule_name="Bücher"), PUBLIC
    )
    assert 3500 < len(body) <= 4096 and fences_balanced(body.decode())
    assert body.decode().endswith("(<https://console.example.com/runs/42>))")
    assert headers["Title"].startswith("=?utf-8?")  # RFC 2047, which ntfy decodes
    dead = note("ntfy", "http://x", event="dead", output=None, error="boom")
    body, headers = ntfy_message(dead, None)
    assert headers["Priority"] == "4" and headers["Tags"] == "x" and "Click" not in headers
    assert b"promptsched runs replay 42" in body and b"boom" in body


def test_failure_messages_say_what_to_do_next() -> None:
    dead = note("slack", "http://x", event="dead", output=None, error="HTTP 401: bad key")
    text = json.dumps(slack_payload(dead, None))
    assert "promptsched runs replay 42" in text and "HTTP 401: bad key" in text
    paused = note("discord", "http://x", event="paused", output=None, error="boom")
    embed = discord_payload(paused, None)["embeds"][0]
    assert "PAUSED" in embed["title"] and "promptsched schedules resume 7" in embed["description"]


def test_a_digest_lists_the_dropped_slots_by_reason() -> None:
    details = {"dropped": {"overlap": 30, "budget": 1}, "total": 31,
               "period_start": "2026-03-02T09:00:00+00:00",
               "period_end": "2026-03-02T10:00:00+00:00"}  # fmt: skip
    digest = note("slack", "http://x", event="digest", output=None, details=details)
    slack = slack_payload(digest, None)
    slack_limits_hold(slack)
    body = "\n".join(b["text"]["text"] for b in slack["blocks"])
    assert "DROPPED 31 ticks" in body and "promptsched schedules edit 7" in body
    assert "Between 2026-03-02 10:00 CET and 2026-03-02 11:00 CET (Europe/Paris):" in body
    assert "• overlap: 30 slots" in body and "• budget: 1 slot (the budget was used up)" in body
    embed = discord_payload(digest, None)["embeds"][0]
    assert embed["title"] == "daily <digest> & co: DROPPED 31 ticks"
    assert "overlap: 30 slots" in embed["description"]


def test_chat_targets_validate_and_never_show_their_url() -> None:
    url = "https://hooks.slack.com/services/T000/B000/XXXXSECRET"
    notify = notify_targets.validate_targets(
        {"slack": url, "discord": {"url": "https://discord.com/api/webhooks/1/tok"}}, allow=LOOPBACK
    )
    assert notify["slack"] == {"url": url}
    shown = notify_targets.public(notify, reveal_secret=True)
    assert shown["slack"] == {"url": notify_targets.mask_url(url), "url_set": True}
    assert shown["slack"]["url"].startswith("https://hooks.slack.com/…#")
    assert "XXXXSECRET" not in json.dumps(shown) and "tok" not in json.dumps(shown)
    # Sending back what was shown keeps the stored URL; a new URL replaces it.
    again = notify_targets.validate_targets(shown, allow=LOOPBACK, current=notify)
    assert again["slack"] == {"url": url}
    with pytest.raises(ValidationError) as caught:
        notify_targets.validate_targets({"discord": {"url": "http://10.0.0.1/x"}}, allow=LOOPBACK)
    assert caught.value.field == "notify.discord.url"
    with pytest.raises(ValidationError) as caught:
        notify_targets.validate_targets({"slack": {"url": url, "channel": "#x"}}, allow=LOOPBACK)
    assert caught.value.field == "notify.slack.channel"


async def chat_schedule(
    pool: asyncpg.Pool[Any], sink: HttpSink, *, ntfy: bool = False, **schedule: Any
) -> int:
    sid = await factories.schedule(pool, **schedule)
    raw = {"slack": {"url": sink.base_url + "/slack/T1/B2/secret-token"},
           "discord": sink.base_url + "/discord/123/secret-token"}  # fmt: skip
    if ntfy:
        raw["ntfy"] = sink.base_url + "/ntfy/secret-token-topic"
    notify = notify_targets.validate_targets(raw, allow=LOOPBACK)
    await pool.execute("UPDATE schedules SET notify = $2 WHERE id = $1", sid, notify)
    return sid


async def test_a_finished_run_posts_once_to_slack_discord_and_ntfy(
    pool: asyncpg.Pool[Any], sink: HttpSink
) -> None:
    clock = FrozenClock(EPOCH)
    sid = await chat_schedule(pool, sink, prompt=LONG, ntfy=True)
    rid = await factories.pending_run(pool, sid)
    await factories.worker_pool(pool, clock).run_once()
    # The outbox never holds the URL (it is the credential), only its host.
    rows = await outbox(pool, rid)
    assert sorted((r["channel"], r["target"]) for r in rows) == [
        ("discord", {"host": "127.0.0.1"}),
        ("ntfy", {"host": "127.0.0.1"}),
        ("slack", {"host": "127.0.0.1"}),
    ]
    assert "secret-token" not in json.dumps([dict(r) for r in rows], default=str)
    notifier = Notifier(
        pool, clock, Metrics(),
        {"slack": SlackSender(allow=LOOPBACK, timeout=5, public_url=PUBLIC),
         "discord": DiscordSender(allow=LOOPBACK, timeout=5, public_url=PUBLIC),
         "ntfy": NtfySender(allow=LOOPBACK, timeout=5, public_url=PUBLIC)},
        NotifierSettings(timeout=timedelta(seconds=5), max_attempts=3),
    )  # fmt: skip
    try:
        counts = await notifier.run_once()
        assert counts["sent"] == 3
        assert await notifier.run_once() == {}
    finally:
        await notifier.aclose()
    by_path = {r.path.split("/")[1]: r for r in sink.requests}
    assert len(sink.requests) == 3 and set(by_path) == {"slack", "discord", "ntfy"}
    slack, discord = by_path["slack"].json(), by_path["discord"].json()
    slack_limits_hold(slack)
    discord_limits_hold(discord)
    assert f"run #{rid}" in slack["blocks"][0]["text"]["text"]
    assert by_path["slack"].headers["Idempotency-Key"] == f"promptsched-{rid}-succeeded-slack"
    assert by_path["discord"].headers["Idempotency-Key"] == f"promptsched-{rid}-succeeded-discord"
    assert [r["status"] for r in await outbox(pool, rid)] == ["sent"] * 3
    pushed = by_path["ntfy"]
    assert pushed.headers["Markdown"] == "yes" and pushed.headers["Title"] == "test succeeded"
    assert pushed.headers["Click"] == f"https://console.example.com/runs/{rid}"
    assert len(pushed.body) <= 4096 and "clipped" in pushed.body.decode()
    # The schedule as the API shows it: the URLs masked.
    shown = views.schedule_json(await queries.schedule_get(pool, sid, None))
    assert shown["notify"]["slack"]["url"].startswith("http://127.0.0.1/…#")
    assert shown["notify"]["slack"]["url_set"] is True


async def test_a_gone_hook_is_dead_at_once_and_a_rate_limit_is_retried_without_the_url(
    sink: HttpSink,
) -> None:
    url = sink.base_url + "/discord/123/secret-token"
    sender = DiscordSender(allow=LOOPBACK, timeout=5, public_url=None)
    sink.script(
        Reply(404, body='{"message": "Unknown Webhook"}'),
        Reply(429, headers={"Retry-After": "3"}, body="slow down"),
    )
    try:
        with pytest.raises(DeliveryError) as gone:
            await sender.send(note("discord", url))
        with pytest.raises(DeliveryError) as limited:
            await sender.send(note("discord", url))
        with pytest.raises(DeliveryError) as refused:
            await sender.send(note("discord", "http://10.1.2.3/api/webhooks/1/secret-token"))
    finally:
        await sender.aclose()
    assert gone.value.retryable is False and "404" in gone.value.message
    assert limited.value.retryable is True and limited.value.retry_after == 3.0
    assert refused.value.retryable is False and "10.1.2.3" in refused.value.message
    for error in (gone.value, limited.value, refused.value):
        assert "secret-token" not in error.message


@pytest.mark.slow
async def test_a_crash_between_send_and_mark_resends_the_same_chat_messages_once(
    dsn: str, pool: asyncpg.Pool[Any], sink: HttpSink, tmp_path: Path
) -> None:
    sid = await chat_schedule(pool, sink)
    env = {"PROMPTSCHED_WEBHOOK_ALLOW": "127.0.0.1/32", "PROMPTSCHED_PUBLIC_URL": PUBLIC}
    rid = await crash_between_send_and_mark(
        dsn, pool, tmp_path, sid, env, lambda: len(sink.requests) == 2
    )
    # Each channel got the same message twice, under the same key: a receiver that keeps the
    # keys it saw shows it once.
    for channel in ("slack", "discord"):
        got = [r for r in sink.requests if r.path.startswith(f"/{channel}/")]
        assert len(got) == 2 and got[0].body == got[1].body
        keys = {r.headers["Idempotency-Key"] for r in got}
        assert keys == {f"promptsched-{rid}-succeeded-{channel}"}
    assert sorted(row["channel"] for row in await outbox(pool, rid)) == ["discord", "slack"]
    # The URLs are credentials: no log line of either process shows one.
    logs = [(tmp_path / name).read_text() for name in ("first.log", "second.log")]
    assert "notification.sent" in logs[1]  # the re-send was logged, with no URL in it
    assert not any("secret-token" in log for log in logs)


async def _deliveries(sink: HttpSink, secret: str) -> None:
    sender = WebhookSender(allow=LOOPBACK, timeout=5)
    try:
        for event, output, error in (("succeeded", "ok", None), ("dead", None, "boom")):
            await sender.send(
                note("webhook", "", event=event, output=output, error=error,
                     idempotency_key=f"promptsched-42-{event}-webhook", target={"url": sink.url},
                     webhook_secret=Secret(secret), chat_url=None)
            )  # fmt: skip
    finally:
        await sender.aclose()


@pytest.mark.parametrize("made_by", ["promptsched", "hand"])
async def test_a_standard_webhooks_receiver_verifies_every_delivery(
    sink: HttpSink, made_by: str
) -> None:
    secret = notify_targets.new_secret() if made_by == "promptsched" else "my-own-secret-1234"
    await _deliveries(sink, secret)
    # A secret promptsched made is handed to the library as it is.
    receiver_secret = secret if made_by == "promptsched" else standard_secret(secret)
    if made_by == "promptsched":
        assert standard_secret(secret) == secret
    receiver = standardwebhooks.Webhook(receiver_secret)
    assert len(sink.requests) == 2
    for request in sink.requests:
        payload = receiver.verify(request.body, dict(request.headers))
        assert payload["id"] == request.headers["webhook-id"] == request.headers["Idempotency-Key"]
        assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
        assert request.headers["Promptsched-Signature"].startswith("t=")  # deprecated, kept
        tampered = request.body.replace(b'"id"', b'"ID"')
        with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
            receiver.verify(tampered, dict(request.headers))
        with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
            standardwebhooks.Webhook(notify_targets.new_secret()).verify(
                request.body, dict(request.headers)
            )


async def test_a_standard_webhooks_receiver_rejects_an_old_delivery(sink: HttpSink) -> None:
    secret = notify_targets.new_secret()
    sender = WebhookSender(allow=LOOPBACK, timeout=5, now=lambda: time.time() - 600)
    try:
        await sender.send(
            note("webhook", "", target={"url": sink.url},
                 idempotency_key="promptsched-42-succeeded-webhook",
                 webhook_secret=Secret(secret), chat_url=None)
        )  # fmt: skip
    finally:
        await sender.aclose()
    [request] = sink.requests
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError, match="too old"):
        standardwebhooks.Webhook(secret).verify(request.body, dict(request.headers))
