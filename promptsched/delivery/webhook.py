"""The webhook channel: a JSON POST per owed notification, signed per Standard Webhooks (and
with the deprecated ``Promptsched-Signature``), with an ``Idempotency-Key`` / ``webhook-id``
that is the same on every re-send, to an address the network guard accepted after DNS
resolution (docs/notifications.md describes the format and how to verify the signature)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable
from datetime import UTC
from typing import Any

import aiohttp
from yarl import URL

from promptsched import netguard
from promptsched.delivery import (
    REPORTS,
    DeliveryError,
    Notification,
    changes_json,
    clip,
    decision,
    rendered,
)
from promptsched.domain import OutboxEvent
from promptsched.secret import Secret

SIGNATURE_HEADER = "Promptsched-Signature"
SECRET_PREFIX = "whsec_"
EXCERPT_CHARS = 300
_RETRY_AFTER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")


# What a report says the run's status was (a pause follows a dead run; a digest or a budget
# notice reports slots that were skipped).
_RUN_STATUS = {
    OutboxEvent.PAUSED: "dead",
    OutboxEvent.DIGEST: "skipped",
    OutboxEvent.BUDGET: "skipped",
}


def payload(notification: Notification) -> dict[str, Any]:
    n = notification
    return {
        "id": n.idempotency_key,
        "event": n.event_type,
        "schedule": {"id": n.schedule_id, "name": n.schedule_name, "timezone": n.timezone},
        "run": {
            "id": n.run_id,
            "status": _RUN_STATUS.get(n.event, n.event),
            "slot": n.slot.astimezone(UTC).isoformat(),
            "slot_local": n.local_slot().isoformat(),
            "origin": n.origin,
            "attempts": n.run_attempts,
            "finished_at": n.finished_at.astimezone(UTC).isoformat() if n.finished_at else None,
        },
        "output": clip(n.output) if n.succeeded and n.output is not None else None,
        # a monitor's structured answer as JSON, why this success notifies, and what changed
        # since the run it was compared with (docs/monitors.md); null otherwise
        "output_json": n.output_json if n.succeeded else None,
        "notify": decision(n),
        "changes": changes_json(n),
        "error": None if n.succeeded or n.event == OutboxEvent.DIGEST else clip(n.error or ""),
        # schedule.digest: {"dropped": {reason: slots}, "total", "period_start", "period_end"}
        # schedule.budget: {"scope", "period", "unit", "limit", "spent", "period_start", "key"}
        **({n.event: n.details} if n.event in REPORTS else {}),
    }


def _body(notification: Notification) -> bytes:
    """The request body (made off the event loop: ``delivery.rendered``)."""
    return json.dumps(payload(notification), ensure_ascii=False).encode()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Promptsched-Signature`` value: ``t=<unix>,v1=<hex HMAC-SHA256 of "t.body">``."""
    signed = str(timestamp).encode() + b"." + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def standard_key(secret: str) -> bytes:
    """The HMAC key of the Standard Webhooks signature, as the spec's libraries derive it:
    the secret without its ``whsec_`` prefix, base64-decoded. A secret that is not base64
    (made before promptsched signed this way, or chosen by hand) is keyed with its own bytes;
    ``standard_secret`` gives the value such a receiver hands to its library."""
    body = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(body, validate=True)
    except binascii.Error:
        key = b""
    return key or body.encode()


def standard_secret(secret: str) -> str:
    """The secret as a Standard Webhooks library takes it (``whsec_`` + base64 of the key);
    the stored secret itself whenever it was made by promptsched."""
    return SECRET_PREFIX + base64.b64encode(standard_key(secret)).decode()


def sign_standard(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


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


def _status_error(
    channel: str, status: int, headers: Any, excerpt: str, permanent: frozenset[int]
) -> DeliveryError:
    label = f"{channel}: HTTP {status}" + (f": {excerpt}" if excerpt else "")
    if 300 <= status < 400:
        location = headers.get("Location", "?") if channel == "webhook" else "(hidden)"
        return DeliveryError(
            f"{channel}: HTTP {status}: redirect to {location} not followed (use the final URL)",
            retryable=False,
        )
    if status == 410:
        return DeliveryError(label + " (the receiver says the hook is gone)", retryable=False)
    if status in permanent:
        return DeliveryError(label + " (sending again would get the same answer)", retryable=False)
    # Anything else may be a receiver's bad moment (a deploy, a bug being fixed): retry within
    # the notifier's attempts, honouring Retry-After given in seconds.
    match = _RETRY_AFTER.match(headers.get("Retry-After", ""))
    return DeliveryError(label, retry_after=float(match.group(1)) if match else None)


class GuardedPoster:
    """POSTs a body to a URL whose host the address guard accepts (checked again after DNS,
    redirects never followed) and maps the answer onto ``DeliveryError``: the one HTTP path of
    the webhook and chat channels. ``hide`` (a URL that is itself a credential) never appears
    in an error."""

    def __init__(self, channel: str, *, allow: netguard.Allowlist, timeout: float) -> None:
        self.channel = channel
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

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        permanent: frozenset[int] = frozenset(),
        hide: Secret | None = None,
    ) -> None:
        try:
            await self._post(url, body, headers, permanent)
        except DeliveryError as error:
            if hide is None:
                raise
            message = hide.redact(error.message)
            raise DeliveryError(
                message, retryable=error.retryable, retry_after=error.retry_after
            ) from None

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], permanent: frozenset[int]
    ) -> None:
        channel = self.channel
        try:
            netguard.check_host(URL(url).host or "", self.allow)
        except netguard.AddressRefused as exc:
            raise DeliveryError(f"{channel}: {exc}", retryable=False) from None
        except ValueError as exc:
            raise DeliveryError(f"{channel}: invalid URL {url!r}: {exc}", retryable=False) from None
        try:
            async with self._session().post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                if 200 <= response.status < 300:
                    return
                excerpt = (await response.content.read(EXCERPT_CHARS)).decode("utf-8", "replace")
                error = _status_error(
                    channel, response.status, response.headers, " ".join(excerpt.split()), permanent
                )
        except netguard.AddressRefused as exc:  # from the resolver, after DNS
            raise DeliveryError(f"{channel}: {exc}", retryable=False) from None
        except aiohttp.InvalidURL as exc:
            raise DeliveryError(f"{channel}: invalid URL {exc}", retryable=False) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise DeliveryError(f"{channel}: {type(exc).__name__}: {exc}") from None
        raise error

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()


class WebhookSender:
    channel = "webhook"

    def __init__(
        self,
        *,
        allow: netguard.Allowlist,
        timeout: float,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.poster = GuardedPoster("webhook", allow=allow, timeout=timeout)
        self.now = now  # the signing time (unix seconds); tests pass an old one

    async def send(self, notification: Notification) -> str | None:
        target = notification.target if isinstance(notification.target, dict) else {}
        url = str(target.get("url") or "")
        secret = notification.webhook_secret
        if not secret:
            raise DeliveryError(
                "webhook: the schedule has no webhook secret any more (was the webhook removed?)",
                retryable=False,
            )
        body = await rendered(_body, notification)
        timestamp = int(self.now())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "promptsched",
            "Idempotency-Key": notification.idempotency_key,
            "Promptsched-Event": notification.event_type,
            # Standard Webhooks (standardwebhooks.com): id, timestamp and signature.
            "webhook-id": notification.idempotency_key,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign_standard(
                secret.reveal(), notification.idempotency_key, timestamp, body
            ),
            # Deprecated (docs/notifications.md): kept until the removal date documented there.
            SIGNATURE_HEADER: sign(secret.reveal(), timestamp, body),
        }
        await self.poster.post(url, body, headers, hide=secret)
        return None

    async def aclose(self) -> None:
        await self.poster.aclose()
