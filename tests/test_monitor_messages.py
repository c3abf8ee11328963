"""A monitor's notification in every channel (pure renderings, docs/monitors.md): why it
notifies, what changed (JSON paths with old and new values, or a diff of the text), and a
structured answer shown readably, or delivered as JSON to a webhook."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from promptsched.delivery import Notification, email, email_html, webhook
from promptsched.delivery import chat as chat_channel

SLOT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
OLD = {"status": "ok", "regions": ["eu", "us"]}
NEW = {"status": "degraded", "regions": ["eu"]}


def note(**changes: Any) -> Notification:
    values: dict[str, Any] = {
        "id": 1, "idempotency_key": "promptsched-42-succeeded-email", "channel": "email",
        "event": "succeeded", "target": ["ops@example.com"], "schedule_id": 7,
        "schedule_name": "status page", "timezone": "UTC", "run_id": 42, "slot": SLOT,
        "origin": "cadence", "run_attempts": 1, "output": json.dumps(NEW), "error": None,
        "finished_at": SLOT, "output_json": NEW, "previous_json": OLD,
        "previous_output": json.dumps(OLD),
        "details": {"notify": True, "when": "changed", "since": 41,
                    "reason": "output changed since run 41"},
    }  # fmt: skip
    values.update(changes)
    return Notification(**values)


def test_a_changed_json_answer_shows_its_paths_everywhere() -> None:
    n = note()
    text = email.body(n)
    assert "Why:      output changed since run 41" in text
    assert '  /status: "ok" → "degraded"' in text and '  /regions/1: removed (was "us")' in text
    assert "- status: degraded" in text and "- regions: eu" in text  # readable, not raw JSON
    assert email.subject(n).startswith("[promptsched] status page CHANGED")
    html = email_html.html(n, None)
    assert "output changed since run 41" in html and '/status: "ok" → "degraded"' in html
    assert "<strong>status</strong>: degraded" in html
    slack = json.dumps(chat_channel.slack_payload(n, None))
    assert "output changed since run 41" in slack and "/status" in slack
    body = webhook.payload(n)
    assert body["output_json"] == NEW
    assert body["notify"] == n.details
    assert body["changes"] == {"since_run": 41, "paths": [
        {"path": "/status", "old": "ok", "new": "degraded"}, {"path": "/regions/1", "old": "us"},
    ]}  # fmt: skip


def test_a_changed_text_answer_shows_a_diff() -> None:
    n = note(output="Status: degraded\nRegions: eu", previous_output="Status: ok\nRegions: eu",
             output_json=None, previous_json=None)  # fmt: skip
    text = email.body(n)
    assert "  -Status: ok\n  +Status: degraded" in text
    assert webhook.payload(n)["changes"] == {
        "since_run": 41,
        "diff": "--- run 41\n+++ run 42\n@@ -1,2 +1,2 @@\n-Status: ok\n+Status: degraded\n "
        "Regions: eu",
    }
    discord = json.dumps(chat_channel.discord_payload(n, None))
    assert "```" in discord and "+Status: degraded" in discord


def test_a_condition_says_why_and_a_plain_success_is_as_before() -> None:
    n = note(details={"notify": True, "when": "/degraded", "reason": "/degraded is true"},
             previous_json=None, previous_output=None)  # fmt: skip
    assert "Why:      /degraded is true" in email.body(n) and "What changed" not in email.body(n)
    assert email.subject(n).startswith("[promptsched] status page succeeded")
    assert webhook.payload(n)["changes"] is None
    plain = note(details=None, output="hello", output_json=None)
    assert "Why:" not in email.body(plain) and "Output:\n\nhello" in email.body(plain)
    assert webhook.payload(plain)["notify"] is None
