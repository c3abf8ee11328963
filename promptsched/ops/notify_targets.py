"""A schedule's notification targets: pure validation of the ``notify`` field (every error
names its field, e.g. ``notify.email``), webhook secret generation, and the public view that
never shows the secret again after creation.

Stored shape (``schedules.notify``; ``{}`` means no notifications)::

    {"on_success": true, "on_failure": true,
     "email": ["ops@example.com"],
     "webhook": {"url": "https://example.com/hook", "secret": "whsec_..."},
     "slack": {"url": "https://hooks.slack.com/services/..."},
     "discord": {"url": "https://discord.com/api/webhooks/..."},
     "ntfy": {"url": "https://ntfy.sh/my-secret-topic"}}

A chat channel's incoming-webhook URL is its credential: like the webhook secret it is never
shown again once stored (``public`` masks it to scheme and host).
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import urllib.parse
from collections.abc import Mapping
from typing import Any

from promptsched import netguard
from promptsched.errors import ValidationError

MAX_EMAILS = 20
MAX_URL = 2000
SECRET_PREFIX = "whsec_"
MIN_SECRET, MAX_SECRET = 16, 256
# The chat channels: an incoming-webhook (or topic) URL that is itself the credential.
CHATS = ("slack", "discord", "ntfy")
CHAT_LABELS = {"slack": "Slack", "discord": "Discord", "ntfy": "ntfy"}
KEYS = ("on_success", "on_failure", "email", "webhook", *CHATS)
_ADDRESS = re.compile(r"^[^@\s<>(),;:\"\\\[\]]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")


def new_secret() -> str:
    """A fresh webhook signing secret (256 bits), in the Standard Webhooks form: ``whsec_``
    and the key in base64, so a receiver hands it to a Standard Webhooks library as it is."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _flag(raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key, True)
    if not isinstance(value, bool):
        raise ValidationError(f"notify.{key}", f"must be true or false, got {value!r}")
    return value


def _emails(value: object) -> list[str]:
    field = "notify.email"
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValidationError(field, "must be an address or a list of addresses")
    if len(items) > MAX_EMAILS:
        raise ValidationError(field, f"at most {MAX_EMAILS} addresses, got {len(items)}")
    found: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise ValidationError(f"{field}[{index}]", "must be a string")
        address = item.strip()
        if len(address) > 254 or not _ADDRESS.match(address) or "." not in address.split("@")[1]:
            raise ValidationError(f"{field}[{index}]", f"not an email address: {item!r}")
        if address.lower() not in (a.lower() for a in found):
            found.append(address)
    return found


def validate_url(
    url: object, *, allow: netguard.Allowlist, field: str = "notify.webhook.url"
) -> str:
    """An absolute http(s) URL whose host is not refused by ``netguard.check_host``."""
    if not isinstance(url, str) or not url.strip():
        raise ValidationError(field, "is required: an http:// or https:// URL")
    url = url.strip()
    if len(url) > MAX_URL or any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise ValidationError(field, "must be a URL without spaces or control characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValidationError(field, f"must start with http:// or https://, got {url!r}")
    try:
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ValidationError(field, f"not a valid URL: {exc}") from None
    if parts.username is not None or parts.password is not None:
        raise ValidationError(field, "must not carry credentials; receivers verify the signature")
    try:
        netguard.check_host(host, allow)
    except netguard.AddressRefused as exc:
        raise ValidationError(field, str(exc)) from None
    return url


def _secret(value: object, current: str | None) -> str:
    if value is None:
        return current or new_secret()
    field = "notify.webhook.secret"
    if not isinstance(value, str) or not MIN_SECRET <= len(value) <= MAX_SECRET:
        raise ValidationError(field, f"must be a string of {MIN_SECRET} to {MAX_SECRET} characters")
    if any(ord(ch) < 33 or ord(ch) > 126 for ch in value):
        raise ValidationError(field, "must be printable ASCII without spaces")
    return value


def _webhook(value: object, *, allow: netguard.Allowlist, current: object) -> dict[str, str]:
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, Mapping):
        raise ValidationError("notify.webhook", "must be an object {url, secret?} or a URL")
    # secret_set is what ``public`` shows: a client may send a schedule it read back unchanged.
    unknown = sorted(set(value) - {"url", "secret", "secret_set"})
    if unknown:
        raise ValidationError(f"notify.webhook.{unknown[0]}", "unknown key (known: url, secret)")
    url = validate_url(value.get("url"), allow=allow)
    kept = current.get("secret") if isinstance(current, Mapping) else None
    return {
        "url": url,
        "secret": _secret(value.get("secret"), kept if isinstance(kept, str) else None),
    }


def mask_url(url: str) -> str:
    """``https://hooks.slack.com/…#1a2b3c``: the host and a short fingerprint (of the whole
    URL), enough to recognise a chat target and to see it change (in the schedule's history),
    never enough to post."""
    parts = urllib.parse.urlsplit(url)
    fingerprint = hashlib.sha256(url.encode()).hexdigest()[:6]
    return f"{parts.scheme}://{parts.hostname or '?'}/…#{fingerprint}"


def _chat(
    name: str, value: object, *, allow: netguard.Allowlist, current: object
) -> dict[str, str]:
    """A Slack or Discord incoming webhook or an ntfy topic: ``{"url": ...}`` or the URL. A
    value read back from ``public`` (the masked URL, or ``url_set`` without a URL) keeps the
    stored one."""
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, Mapping):
        raise ValidationError(
            f"notify.{name}", "must be an object {url} or an incoming-webhook URL"
        )
    unknown = sorted(set(value) - {"url", "url_set"})
    if unknown:
        raise ValidationError(f"notify.{name}.{unknown[0]}", "unknown key (known: url)")
    kept = current.get("url") if isinstance(current, Mapping) else None
    url = value.get("url")
    if isinstance(kept, str) and (url is None or url == mask_url(kept)):
        return {"url": kept}
    return {"url": validate_url(url, allow=allow, field=f"notify.{name}.url")}


def validate_targets(
    raw: object, *, allow: netguard.Allowlist, current: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The normalized ``notify`` value to store, or ValidationError naming the bad field.

    ``None`` or ``{}`` means no notifications. A webhook without a ``secret`` keeps the one in
    ``current`` (the stored settings, on an update) or gets a new one. ``on_success`` and
    ``on_failure`` default to true.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValidationError(
            "notify", "must be an object with email, webhook, slack, discord or ntfy"
        )
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ValidationError(f"notify.{unknown[0]}", f"unknown key (known: {', '.join(KEYS)})")
    flags = {"on_success": _flag(raw, "on_success"), "on_failure": _flag(raw, "on_failure")}
    result: dict[str, Any] = {}
    if raw.get("email") is not None:
        emails = _emails(raw["email"])
        if emails:
            result["email"] = emails
    if raw.get("webhook") is not None:
        result["webhook"] = _webhook(
            raw["webhook"], allow=allow, current=(current or {}).get("webhook")
        )
    for name in CHATS:
        if raw.get(name) is not None:
            result[name] = _chat(name, raw[name], allow=allow, current=(current or {}).get(name))
    return {**flags, **result} if result else {}


def public(notify: Mapping[str, Any] | None, *, reveal_secret: bool = False) -> dict[str, Any]:
    """``notify`` as API responses show it: the webhook secret is replaced by ``secret_set``,
    unless ``reveal_secret`` (only in the response that created or rotated it); chat webhook
    URLs are always masked (``url_set``)."""
    view = dict(notify or {})
    webhook = view.get("webhook")
    if isinstance(webhook, Mapping):
        hook = {key: value for key, value in webhook.items() if key != "secret"}
        hook["secret_set"] = bool(webhook.get("secret"))
        if reveal_secret and webhook.get("secret"):
            hook["secret"] = webhook["secret"]
        view["webhook"] = hook
    for name in CHATS:
        chat = view.get(name)
        if isinstance(chat, Mapping) and isinstance(chat.get("url"), str):
            view[name] = {"url": mask_url(chat["url"]), "url_set": True}
    return view


def words(
    notify: Mapping[str, Any] | None, *, secret_from: str | None = None, when: bool = True
) -> str:
    """A ``public`` view of the targets in words, e.g. ``email ops@example.com; Slack
    https://hooks.slack.com/… on success and failure``: the CLI and the console say it so. A
    webhook secret present in the view (the one response that reveals it) is shown once, or
    only named by the file it came from (``secret_from``). ``when=False`` leaves out the
    events (an escalation step's targets hear of the escalation only)."""
    if not notify:
        return "none"
    events = [e for e, key in (("success", "on_success"), ("failure", "on_failure"))
              if notify.get(key, True)]  # fmt: skip
    targets = []
    if notify.get("email"):
        targets.append("email " + ", ".join(notify["email"]))
    hook = notify.get("webhook")
    if isinstance(hook, Mapping):
        secret = hook.get("secret")
        signed = (
            f"signed with the secret in {secret_from}"
            if secret and secret_from
            else f"signed with secret {secret} (shown once)"
            if secret
            else ("signed" if hook.get("secret_set") else "unsigned")
        )
        targets.append(f"webhook {hook.get('url')} ({signed})")
    for key, label in CHAT_LABELS.items():
        chat = notify.get(key)
        if isinstance(chat, Mapping) and chat.get("url"):
            targets.append(f"{label} {chat['url']}")  # masked in a public view
    if not targets:
        return "none"
    if not when:
        return "; ".join(targets)
    on = " and ".join(events) or "nothing"
    return f"{'; '.join(targets)} on {on}"
