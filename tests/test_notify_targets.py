"""Validation of a schedule's notification targets: every error names its field."""

from __future__ import annotations

from typing import Any

import pytest

from promptsched import notify_targets
from promptsched.errors import ValidationError


def _error(raw: Any, *, allow_private: bool = False) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        notify_targets.validate_targets(raw, allow_private=allow_private)
    return caught.value


@pytest.mark.parametrize("raw", [None, {}, {"email": []}, {"on_failure": False}])
def test_nothing_to_notify_stores_an_empty_object(raw: Any) -> None:
    assert notify_targets.validate_targets(raw, allow_private=False) == {}


def test_a_full_setting_is_normalized() -> None:
    result = notify_targets.validate_targets(
        {
            "email": [" ops@example.com ", "OPS@example.com", "alice@example.org"],
            "webhook": "https://hooks.example.com/promptsched",
            "on_failure": False,
        },
        allow_private=False,
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
    result = notify_targets.validate_targets({"email": "a@b.co"}, allow_private=False)
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
    ("url", "reason"),
    [
        ("http://127.0.0.1:8080/hook", "loopback address 127.0.0.1 refused"),
        ("http://10.0.0.1/hook", "private address 10.0.0.1 refused"),
        ("http://192.168.1.20/hook", "private address 192.168.1.20 refused"),
        ("http://169.254.169.254/latest/meta-data", "link-local address 169.254.169.254"),
        ("http://[::1]:9000/", "loopback address ::1 refused"),
        ("http://[::ffff:10.0.0.1]/", "private address 10.0.0.1 refused"),
        ("http://[fd00::1]/", "private address fd00::1 refused"),
        ("http://localhost:8080/", "loopback address localhost refused"),
        ("http://api.localhost/", "loopback address api.localhost refused"),
        ("http://100.64.0.1/", "non-public address 100.64.0.1 refused"),
    ],
)
def test_webhooks_to_private_addresses_are_refused_by_default(url: str, reason: str) -> None:
    error = _error({"webhook": {"url": url}})
    assert error.field == "notify.webhook.url"
    assert reason in error.message
    assert "PROMPTSCHED_ALLOW_PRIVATE_WEBHOOKS=true" in error.message
    # ... and accepted when the server allows them (development, tests).
    allowed = notify_targets.validate_targets({"webhook": url}, allow_private=True)
    assert allowed["webhook"]["url"] == url


@pytest.mark.parametrize(
    "url", ["http://2130706433/", "http://127.1/", "http://0x7f.0.0.1/", "http://0.0.0.0/"]
)
def test_numeric_tricks_and_unspecified_are_refused_even_when_private_is_allowed(url: str) -> None:
    assert _error({"webhook": url}, allow_private=True).field == "notify.webhook.url"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "must start with http:// or https://"),
        ("https://", "empty address"),
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
        {"webhook": {"url": "https://e.com", "secret": "s" * 32}}, allow_private=False
    )
    assert result["webhook"]["secret"] == "s" * 32


def test_an_update_without_a_secret_keeps_the_stored_one() -> None:
    current = {"webhook": {"url": "https://old.example.com", "secret": "kept-secret-1234567"}}
    result = notify_targets.validate_targets(
        {"webhook": "https://new.example.com"}, allow_private=False, current=current
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
        {"email": "a@b.co", "webhook": "https://e.com"}, allow_private=False
    )
    again = notify_targets.validate_targets(
        notify_targets.public(stored), allow_private=False, current=stored
    )
    assert again == stored


def test_the_public_view_shows_the_secret_only_when_asked() -> None:
    stored = notify_targets.validate_targets({"webhook": "https://e.com"}, allow_private=False)
    shown = notify_targets.public(stored)
    assert shown["webhook"] == {"url": "https://e.com", "secret_set": True}
    assert stored["webhook"]["secret"] not in str(shown)
    once = notify_targets.public(stored, reveal_secret=True)
    assert once["webhook"]["secret"] == stored["webhook"]["secret"]
    assert notify_targets.public({}) == {}
