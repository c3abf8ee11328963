"""Validation of a schedule's notification targets: every error names its field."""

from __future__ import annotations

from typing import Any

import pytest

from promptsched import netguard
from promptsched.errors import ValidationError
from promptsched.ops import notify_targets

NOTHING = netguard.NO_WEBHOOK_ALLOW


def _allow(text: str) -> netguard.Allowlist:
    return netguard.Allowlist.parse(text, variable=netguard.WEBHOOK_ALLOW)


def _error(raw: Any, *, allow: str = "") -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        notify_targets.validate_targets(raw, allow=_allow(allow))
    return caught.value


@pytest.mark.parametrize("raw", [None, {}, {"email": []}, {"on_failure": False}])
def test_nothing_to_notify_stores_an_empty_object(raw: Any) -> None:
    assert notify_targets.validate_targets(raw, allow=NOTHING) == {}


def test_a_full_setting_is_normalized() -> None:
    result = notify_targets.validate_targets(
        {
            "email": [" ops@example.com ", "OPS@example.com", "alice@example.org"],
            "webhook": "https://hooks.example.com/promptsched",
            "on_failure": False,
        },
        allow=NOTHING,
    )
    secret = result["webhook"]["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    assert result == {
        "on_success": True,
        "on_failure": False,
        "email": ["ops@example.com", "alice@example.org"],
        "webhook": {"url": "https://hooks.example.com/promptsched", "secret": secret},
    }


def test_a_single_address_is_accepted_as_a_string() -> None:
    result = notify_targets.validate_targets({"email": "a@b.co"}, allow=NOTHING)
    assert result["email"] == ["a@b.co"]


@pytest.mark.parametrize(
    ("address", "field"),
    [
        ("not-an-address", "notify.email[0]"),
        ("a@b", "notify.email[0]"),
        ("a@b.co\r\nBcc: victim@example.com", "notify.email[0]"),
        ("Name <a@b.co>", "notify.email[0]"),
        (42, "notify.email[0]"),
    ],
)
def test_a_bad_address_is_refused_naming_it(address: Any, field: str) -> None:
    error = _error({"email": [address]})
    assert error.field == field


def test_too_many_addresses_are_refused() -> None:
    error = _error({"email": [f"user{i}@example.com" for i in range(21)]})
    assert (error.field, "at most 20" in error.message) == ("notify.email", True)


@pytest.mark.parametrize(
    ("url", "message", "allow"),
    [
        (
            "http://127.0.0.1:8080/hook",
            "127.0.0.1 is loopback and not in PROMPTSCHED_WEBHOOK_ALLOW",
            "127.0.0.1/32",
        ),
        ("http://10.0.0.1/hook", "10.0.0.1 is private and not in", "10.0.0.0/8"),
        ("http://192.168.1.20/hook", "192.168.1.20 is private and not in", "192.168.1.0/24"),
        (
            "http://169.254.169.254/latest/meta-data",
            "169.254.169.254 is a cloud metadata address; list it exactly (169.254.169.254/32) "
            "in PROMPTSCHED_WEBHOOK_ALLOW to allow it",
            "169.254.169.254",
        ),
        (
            "http://169.254.10.1/",
            "169.254.10.1 is a link-local address; list it exactly (169.254.10.1/32)",
            "169.254.10.1/32",
        ),
        ("http://[::1]:9000/", "::1 is loopback and not in", "::1"),
        (
            "http://[::ffff:10.0.0.1]/",
            "10.0.0.1 (embedded in ::ffff:a00:1) is private and not in",
            "10.0.0.0/8",
        ),
        ("http://[fd00::1]/", "fd00::1 is private and not in", "fd00::/8"),
        ("http://localhost:8080/", "localhost is a loopback name and not in", "localhost"),
        ("http://api.localhost/", "api.localhost is a loopback name and not in", "127.0.0.0/8"),
        (
            "http://100.64.0.1/",
            "100.64.0.1 is shared address space (CGNAT, 100.64.0.0/10) and not in",
            "100.64.0.0/10",
        ),
        ("http://0.0.0.0/", "0.0.0.0 is unspecified and not in", "0.0.0.0/32"),
        ("http://224.0.0.1/", "224.0.0.1 is multicast and not in", "224.0.0.0/4"),
    ],
)
def test_webhooks_to_non_public_addresses_are_refused_naming_the_rule(
    url: str, message: str, allow: str
) -> None:
    error = _error({"webhook": {"url": url}})
    assert error.field == "notify.webhook.url"
    assert message in error.message
    # ... and accepted when the allowlist lets the address through.
    allowed = notify_targets.validate_targets({"webhook": url}, allow=_allow(allow))
    assert allowed["webhook"]["url"] == url


@pytest.mark.parametrize(
    "url", ["http://2130706433/", "http://127.1/", "http://0x7f.0.0.1/", "http://0177.0.0.1/"]
)
def test_numeric_tricks_are_refused_whatever_the_allowlist(url: str) -> None:
    error = _error({"webhook": url}, allow="0.0.0.0/0,::/0")
    assert error.field == "notify.webhook.url"
    assert "non-canonical numeric address" in error.message
    assert "PROMPTSCHED_WEBHOOK_ALLOW" not in error.message  # no advice that cannot help


def test_a_wide_range_never_opens_the_metadata_address() -> None:
    error = _error({"webhook": "http://169.254.169.254/"}, allow="0.0.0.0/0,169.254.0.0/16")
    assert error.message == (
        "169.254.169.254 is a cloud metadata address, which only an exact entry allows: "
        "PROMPTSCHED_WEBHOOK_ALLOW covers it only with the wider range 0.0.0.0/0; "
        "list 169.254.169.254/32 itself to allow it"
    )
    # A wide range still opens ordinary private and loopback addresses.
    notify_targets.validate_targets({"webhook": "http://10.1.2.3/"}, allow=_allow("0.0.0.0/0"))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "must start with http:// or https://"),
        ("https://", "the URL has no host"),
        ("https://user:pw@example.com/", "must not carry credentials"),
        ("https://example.com:99999/", "not a valid URL"),
        ("https://exa mple.com/", "without spaces"),
        ("", "is required"),
    ],
)
def test_malformed_webhook_urls_are_refused(url: str, message: str) -> None:
    error = _error({"webhook": {"url": url}})
    assert error.field == "notify.webhook.url" and message in error.message


def test_a_given_secret_is_checked_and_kept() -> None:
    assert _error({"webhook": {"url": "https://e.com", "secret": "short"}}).field == (
        "notify.webhook.secret"
    )
    result = notify_targets.validate_targets(
        {"webhook": {"url": "https://e.com", "secret": "s" * 32}}, allow=NOTHING
    )
    assert result["webhook"]["secret"] == "s" * 32


def test_an_update_without_a_secret_keeps_the_stored_one() -> None:
    current = {"webhook": {"url": "https://old.example.com", "secret": "kept-secret-1234567"}}
    result = notify_targets.validate_targets(
        {"webhook": "https://new.example.com"}, allow=NOTHING, current=current
    )
    assert result["webhook"] == {"url": "https://new.example.com", "secret": "kept-secret-1234567"}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"emails": ["a@b.co"]}, "notify.emails"),
        ({"email": ["a@b.co"], "on_failure": "yes"}, "notify.on_failure"),
        ({"webhook": {"url": "https://e.com", "headers": {}}}, "notify.webhook.headers"),
        ({"webhook": 42}, "notify.webhook"),
        (["a@b.co"], "notify"),
    ],
)
def test_unknown_keys_and_wrong_types_name_their_field(raw: Any, field: str) -> None:
    assert _error(raw).field == field


def test_a_public_view_sent_back_unchanged_keeps_the_stored_secret() -> None:
    stored = notify_targets.validate_targets(
        {"email": "a@b.co", "webhook": "https://e.com"}, allow=NOTHING
    )
    again = notify_targets.validate_targets(
        notify_targets.public(stored), allow=NOTHING, current=stored
    )
    assert again == stored


def test_the_public_view_shows_the_secret_only_when_asked() -> None:
    stored = notify_targets.validate_targets({"webhook": "https://e.com"}, allow=NOTHING)
    shown = notify_targets.public(stored)
    assert shown["webhook"] == {"url": "https://e.com", "secret_set": True}
    assert stored["webhook"]["secret"] not in str(shown)
    once = notify_targets.public(stored, reveal_secret=True)
    assert once["webhook"]["secret"] == stored["webhook"]["secret"]
    assert notify_targets.public({}) == {}
