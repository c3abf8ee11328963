"""The webhook channel against a real HTTP sink: payload, headers, the documented signature
check, status handling, and the address guard before and after DNS resolution."""

from __future__ import annotations

import hashlib
import hmac
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promptsched import netguard
from promptsched.delivery import DeliveryError, Notification
from promptsched.delivery.webhook import WebhookSender, sign
from promptsched.secret import Secret
from tests.fakes.http_sink import HttpSink, Reply, start_http_sink

ROOT = Path(__file__).resolve().parent.parent
SECRET = "whsec_test-secret-0123456789abcdef"
SLOT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _notification(url: str, **changes: Any) -> Notification:
    values: dict[str, Any] = {
        "id": 1,
        "idempotency_key": "promptsched-42-succeeded-webhook",
        "channel": "webhook",
        "event": "succeeded",
        "target": {"url": url},
        "schedule_id": 7,
        "schedule_name": "daily digest",
        "timezone": "Europe/Paris",
        "run_id": 42,
        "slot": SLOT,
        "origin": "cadence",
        "run_attempts": 3,
        "output": "the answer",
        "error": None,
        "finished_at": SLOT.replace(second=4),
        "webhook_secret": Secret(SECRET),
    }
    values.update(changes)
    return Notification(**values)


def documented_verifier() -> Callable[..., bool]:
    """The first code block under "Verifying signatures" in docs/notifications.md, run as is."""
    text = (ROOT / "docs" / "notifications.md").read_text()
    section = text.split("### Verifying signatures", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/notifications.md", "exec"), namespace)
    verifier: Callable[..., bool] = namespace["verify_signature"]
    return verifier


LOOPBACK = netguard.Allowlist.parse("127.0.0.1/32", variable=netguard.WEBHOOK_ALLOW)


async def _send(
    sink_url: str, notification: Notification, *, allow: netguard.Allowlist = LOOPBACK
) -> None:
    sender = WebhookSender(allow=allow, timeout=5)
    try:
        await sender.send(notification)
    finally:
        await sender.aclose()


async def test_a_delivery_carries_the_payload_key_and_a_verifiable_signature(
    sink: HttpSink,
) -> None:
    before = int(time.time())
    await _send(sink.url, _notification(sink.url))
    [request] = sink.requests
    assert (request.method, request.path) == ("POST", "/hook")
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Idempotency-Key"] == "promptsched-42-succeeded-webhook"
    assert request.headers["Promptsched-Event"] == "run.succeeded"
    assert request.json() == {
        "id": "promptsched-42-succeeded-webhook",
        "event": "run.succeeded",
        "schedule": {"id": 7, "name": "daily digest", "timezone": "Europe/Paris"},
        "run": {
            "id": 42,
            "status": "succeeded",
            "slot": "2026-03-02T09:00:00+00:00",
            "slot_local": "2026-03-02T10:00:00+01:00",
            "origin": "cadence",
            "attempts": 3,
            "finished_at": "2026-03-02T09:00:04+00:00",
        },
        "output": "the answer",
        "output_json": None,
        "notify": None,
        "changes": None,
        "error": None,
    }
    header = request.headers["Promptsched-Signature"]
    timestamp = int(header.split(",")[0].removeprefix("t="))
    assert before <= timestamp <= int(time.time())
    verify = documented_verifier()
    assert verify(SECRET, request.body, header) is True
    # Anything changed fails: the body, the secret, the timestamp, or its age.
    assert verify(SECRET, request.body.replace(b"the answer", b"the ANSWER"), header) is False
    assert verify("whsec_another-secret-000000000000", request.body, header) is False
    forged = header.replace(f"t={timestamp}", f"t={timestamp + 1}")
    assert verify(SECRET, request.body, forged) is False
    assert verify(SECRET, request.body, header, now=timestamp + 301) is False
    assert verify(SECRET, request.body, "garbage") is False


def test_the_documented_procedure_agrees_with_the_signer() -> None:
    verify = documented_verifier()
    body = b'{"a": 1}'
    header = sign(SECRET, 1_700_000_000, body)
    expected = hmac.new(SECRET.encode(), b'1700000000.{"a": 1}', hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"
    assert verify(SECRET, body, header, now=1_700_000_100) is True


async def test_a_dead_run_sends_its_error_and_no_output(sink: HttpSink) -> None:
    notification = _notification(
        sink.url,
        event="dead",
        idempotency_key="promptsched-42-dead-webhook",
        output=None,
        error="echo: injected failure on attempt 3",
    )
    await _send(sink.url, notification)
    body = sink.requests[0].json()
    assert (body["event"], body["run"]["status"]) == ("run.dead", "dead")
    assert (body["output"], body["error"]) == (None, "echo: injected failure on attempt 3")
    assert sink.requests[0].headers["Idempotency-Key"] == "promptsched-42-dead-webhook"


@pytest.mark.parametrize(
    ("reply", "permanent", "retry_after", "text"),
    [
        (Reply(500, body="boom"), False, None, "webhook: HTTP 500: boom"),
        (Reply(503, {"Retry-After": "7"}), False, 7.0, "HTTP 503"),
        (Reply(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}), False, None, "HTTP 429"),
        (Reply(404, body="no such hook"), False, None, "HTTP 404: no such hook"),
        (Reply(410, body="gone"), True, None, "the receiver says the hook is gone"),
        (Reply(302, {"Location": "https://elsewhere.example/"}), True, None, "not followed"),
    ],
)
async def test_statuses_map_to_retry_or_dead(
    sink: HttpSink, reply: Reply, permanent: bool, retry_after: float | None, text: str
) -> None:
    sink.script(reply)
    with pytest.raises(DeliveryError) as caught:
        await _send(sink.url, _notification(sink.url))
    error = caught.value
    assert (not error.retryable, error.retry_after) == (permanent, retry_after)
    assert text in error.message
    assert len(sink.requests) == 1  # redirects are not followed


async def test_an_error_body_echoing_the_secret_is_redacted(sink: HttpSink) -> None:
    sink.script(Reply(400, body=f"bad signature for secret {SECRET}"))
    with pytest.raises(DeliveryError) as caught:
        await _send(sink.url, _notification(sink.url))
    assert SECRET not in caught.value.message and "********" in caught.value.message


async def test_a_closed_port_is_a_retryable_connection_error() -> None:
    async with start_http_sink() as closed:
        url = closed.url
    with pytest.raises(DeliveryError) as caught:
        await _send(url, _notification(url))
    assert caught.value.retryable is True
    assert "Connect" in caught.value.message


async def test_loopback_is_refused_at_send_time_unless_allowed(sink: HttpSink) -> None:
    with pytest.raises(DeliveryError) as caught:
        await _send(sink.url, _notification(sink.url), allow=netguard.NO_WEBHOOK_ALLOW)
    assert caught.value.retryable is False
    assert caught.value.message == (
        "webhook: 127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW"
    )
    assert sink.requests == []


async def test_a_name_resolving_to_a_private_address_is_refused_after_dns(
    sink: HttpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def rebinding_dns(host: str, port: int, **kwargs: Any) -> list[Any]:
        # The name passed the save-time check; now DNS answers with loopback.
        assert host == "hooks.example.test"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(netguard.anyio, "getaddrinfo", rebinding_dns)
    port = sink.base_url.rsplit(":", 1)[1]
    url = f"http://hooks.example.test:{port}/hook"
    with pytest.raises(DeliveryError) as caught:
        await _send(url, _notification(url), allow=netguard.NO_WEBHOOK_ALLOW)
    assert caught.value.retryable is False
    assert (
        "127.0.0.1 (hooks.example.test resolves to it) is loopback and not in "
        "PROMPTSCHED_WEBHOOK_ALLOW"
    ) in caught.value.message
    assert sink.requests == []
    # With loopback allowed, the connection goes exactly where the guard resolved.
    await _send(url, _notification(url))
    assert [request.headers["Host"] for request in sink.requests] == [f"hooks.example.test:{port}"]


async def test_a_webhook_without_a_secret_is_not_sent(sink: HttpSink) -> None:
    with pytest.raises(DeliveryError, match="no webhook secret") as caught:
        await _send(sink.url, _notification(sink.url, webhook_secret=None))
    assert caught.value.retryable is False
    assert sink.requests == []
