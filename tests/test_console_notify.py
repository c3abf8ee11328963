"""The schedule form's notification section in headless Chromium against a real service: set
an email and a Slack target, see them described in words, and never see the Slack URL (a
credential) or the webhook secret again; edit, keep, replace and remove targets; bad input is
refused naming the field and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from promptsched.ops import notify_targets
from promptsched.web import auth
from tests.browser_support import chromium, screenshot, wait
from tests.test_console_browser import _by, base, fill_form, login, see, text  # noqa: F401

pytestmark = pytest.mark.browser

SLACK = "https://hooks.slack.com/services/T000/B000/SLACKSECRET"
NEW_SLACK = "https://hooks.slack.com/services/T000/B000/NEWSLACKSECRET"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


async def stored(pool: asyncpg.Pool[Any]) -> dict[str, Any]:
    raw = await pool.fetchval("SELECT notify FROM schedules ORDER BY id DESC LIMIT 1")
    return raw if isinstance(raw, dict) else json.loads(raw)


def never_shows_a_credential(driver: Any, *secrets: str) -> None:
    source = driver.page_source
    for secret in secrets:
        assert secret not in source, f"{secret[:12]}… is in the page"


async def test_set_email_and_slack_in_the_form_described_in_words_never_shown_again(
    browser: Any,
    base: str,  # noqa: F811
    pool: asyncpg.Pool[Any],
) -> None:
    token, _ = await auth.create_token(pool, owner="a")
    login(browser, base, token)
    browser.get(f"{base}/schedules/new")
    see(browser, "Notifies nobody.", "#notify-words")
    fill_form(browser, name="digest", expression="0 9 * * 1", prompt="Summarise the week",
              notify_email="ops@example.com, lead@example.com", notify_slack=SLACK)  # fmt: skip
    browser.find_element(*_by("input[name=notify_on_success]")).click()  # failures only
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule created.")
    masked = notify_targets.mask_url(SLACK)
    words = f"email ops@example.com, lead@example.com; Slack {masked} on failure"
    see(browser, words)
    never_shows_a_credential(browser, "SLACKSECRET")
    screenshot(browser, "notify-schedule")
    notify = await stored(pool)
    assert notify["slack"] == {"url": SLACK} and notify["on_success"] is False
    assert notify["email"] == ["ops@example.com", "lead@example.com"]

    # The edit form describes the targets and keeps the credential out of the page.
    schedule_url = browser.current_url.split("?")[0]
    browser.get(f"{schedule_url}/edit")
    see(browser, words, "#notify-words")
    state = text(browser, "#notify-slack-state")
    assert state.startswith(f"set: {masked}")
    assert browser.find_element(*_by("#f-notify_slack")).get_attribute("value") == ""
    never_shows_a_credential(browser, "SLACKSECRET")
    screenshot(browser, "notify-edit-form")

    # Saving with the field left empty keeps the stored URL; a webhook gets a secret shown once.
    fill_form(browser, notify_webhook="https://hooks.example.com/in")
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "shown only this once")
    secret = text(browser, "#webhook-secret")
    notify = await stored(pool)
    assert notify["slack"] == {"url": SLACK} and notify["webhook"]["secret"] == secret
    browser.find_element(*_by("main a[href^='/schedules/']")).click()
    see(browser, "webhook https://hooks.example.com/in (signed)")
    never_shows_a_credential(browser, "SLACKSECRET", secret)
    browser.get(f"{schedule_url}/edit")
    never_shows_a_credential(browser, "SLACKSECRET", secret)

    # A bad address is refused naming the field, and nothing stored changes.
    fill_form(browser, notify_email="not-an-address", notify_slack=NEW_SLACK)
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "notify.email[0]", "#m-notify")
    assert await stored(pool) == notify
    never_shows_a_credential(browser, "SLACKSECRET", secret)  # nor the one just typed
    assert "NEWSLACKSECRET" not in browser.page_source

    # Replace the Slack URL, then remove it.
    fill_form(browser, notify_email="ops@example.com", notify_slack=NEW_SLACK)
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule saved.")
    assert (await stored(pool))["slack"] == {"url": NEW_SLACK}
    browser.get(f"{schedule_url}/edit")
    browser.find_element(*_by("input[name=notify_remove_slack]")).click()
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule saved.")
    notify = await stored(pool)
    assert "slack" not in notify and notify["email"] == ["ops@example.com"]
    assert notify["webhook"]["secret"] == secret  # untouched all along
    wait(browser, lambda d: "Slack" not in text(d), what="the Slack target to be gone")
