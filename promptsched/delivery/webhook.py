"""The webhook channel: a signed JSON POST per owed notification, with an ``Idempotency-Key``
that is the same on every re-send, to an address the network guard accepted after DNS
resolution (docs/notifications.md describes the format and how to verify the signature)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from datetime import UTC
from typing import Any

import aiohttp
from yarl import URL

from promptsched import netguard
from promptsched.delivery import DeliveryError, Notification, clip

SIGNATURE_HEADER = "Promptsched-Signature"
EXCERPT_CHARS = 300
_RETRY_AFTER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")


def payload(notification: Notification) -> dict[str, Any]:
    n = notification
    return {
        "id": n.idempotency_key,
        "event": n.event_type,
        "schedule": {"id": n.schedule_id, "name": n.schedule_name, "timezone": n.timezone},
        "run": {
            "id": n.run_id,
            "status": "dead" if n.event == "paused" else n.event,
            "slot": n.slot.astimezone(UTC).isoformat(),
            "slot_local": n.local_slot().isoformat(),
            "origin": n.origin,
            "attempts": n.run_attempts,
            "finished_at": n.finished_at.astimezone(UTC).isoformat() if n.finished_at else None,
        },
        "output": clip(n.output) if n.succeeded and n.output is not None else None,
        "error": None if n.succeeded else clip(n.error or ""),
    }


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Promptsched-Signature`` value: ``t=<unix>,v1=<hex HMAC-SHA256 of "t.body">``."""
    signed = str(timestamp).encode() + b"." + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, *, now: float, tolerance: float = 300) -> bool:
    """A receiver's check (the reference for docs/notifications.md): a ``v1`` signature of
    ``t.body`` matches and ``t`` is within ``tolerance`` seconds of ``now``."""
    fields = [part.split("=", 1) for part in header.split(",") if "=" in part]
    timestamps = [value for key, value in fields if key.strip() == "t"]
    if len(timestamps) != 1 or not timestamps[0].strip().isdigit():
        return False
    timestamp = int(timestamps[0])
    if abs(now - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).rsplit("v1=", 1)[1]
    return any(
        key.strip() == "v1" and hmac.compare_digest(value.strip(), expected)
        for key, value in fields
    )


def _status_error(status: int, headers: Any, excerpt: str) -> DeliveryError:
    label = f"webhook: HTTP {status}" + (f": {excerpt}" if excerpt else "")
    if 300 <= status < 400:
        location = headers.get("Location", "?")
        return DeliveryError(
            f"webhook: HTTP {status}: redirect to {location} not followed (use the final URL)",
            retryable=False,
        )
    if status == 410:
        return DeliveryError(label + " (the receiver says the hook is gone)", retryable=False)
    # Anything else may be a receiver's bad moment (a deploy, a bug being fixed): retry within
    # the notifier's attempts, honouring Retry-After given in seconds.
    match = _RETRY_AFTER.match(headers.get("Retry-After", ""))
    return DeliveryError(label, retry_after=float(match.group(1)) if match else None)


def _refused(exc: netguard.AddressRefused) -> DeliveryError:
    return DeliveryError(f"webhook: {exc}", retryable=False)


class WebhookSender:
    channel = "webhook"

    def __init__(self, *, allow: netguard.Allowlist, timeout: float) -> None:
        self.allow = allow
        self.timeout = timeout
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # Every connection goes to an address the guard checked; no redirects followed.
            self._http = netguard.guarded_session(
                self.allow, aiohttp.ClientTimeout(total=self.timeout)
            )
        return self._http

    async def send(self, notification: Notification) -> str | None:
        target = notification.target if isinstance(notification.target, dict) else {}
        url = str(target.get("url") or "")
        secret = notification.webhook_secret
        if not secret:
            raise DeliveryError(
                "webhook: the schedule has no webhook secret any more (was the webhook removed?)",
                retryable=False,
            )
        try:
            netguard.check_host(URL(url).host or "", self.allow)
        except netguard.AddressRefused as exc:
            raise _refused(exc) from None
        except ValueError as exc:
            raise DeliveryError(f"webhook: invalid URL {url!r}: {exc}", retryable=False) from None
        body = json.dumps(payload(notification), ensure_ascii=False).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "promptsched",
            "Idempotency-Key": notification.idempotency_key,
            "Promptsched-Event": notification.event_type,
            SIGNATURE_HEADER: sign(secret.reveal(), int(time.time()), body),
        }
        try:
            async with self._session().post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                if 200 <= response.status < 300:
                    return None
                excerpt = (await response.content.read(EXCERPT_CHARS)).decode("utf-8", "replace")
                error = _status_error(response.status, response.headers, " ".join(excerpt.split()))
        except netguard.AddressRefused as exc:  # from the resolver, after DNS
            raise _refused(exc) from None
        except aiohttp.InvalidURL as exc:
            raise DeliveryError(f"webhook: invalid URL {exc}", retryable=False) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise DeliveryError(f"webhook: {type(exc).__name__}: {exc}") from None
        raise DeliveryError(
            secret.redact(error.message), retry_after=error.retry_after, retryable=error.retryable
        )

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()
