"""The console in headless Chromium against a real ``promptsched run`` process: log in,
create a schedule through the form and watch its live preview, see a run appear and succeed,
pause and resume, replay a dead run, another owner sees none of it, markup stays text, and
the read-only pages and a confirmed action work with JavaScript off. Screenshots of the main
pages go to build/screenshots/."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched.web import auth
from tests.browser_support import chromium, screenshot, wait
from tests.helpers import Service

pytestmark = pytest.mark.browser

EVIL = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
async def base(dsn: str, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a real service over this test's database."""
    service = Service(dsn, tmp_path / "service.log")
    try:
        await service.ready()
        port = (await service.wait_event("api.listening"))["port"]
        yield f"http://127.0.0.1:{port}"
    finally:
        service.stop()


def _by(css: str) -> tuple[str, str]:
    return ("css selector", css)


def login(driver: Any, base: str, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{base}/login")
    driver.find_element(*_by("#token")).send_keys(token)
    driver.find_element(*_by("form button[type=submit]")).click()
    wait(driver, lambda d: d.current_url == f"{base}/", what="the schedules page")


def click_confirmed(driver: Any, button_css: str) -> None:
    """Click an action and accept the script's confirmation dialog."""
    driver.find_element(*_by(button_css)).click()
    alert = wait(driver, lambda d: d.switch_to.alert, what="the confirmation dialog")
    alert.accept()


def text(driver: Any, css: str = "main") -> str:
    return str(driver.find_element(*_by(css)).text)


def see(driver: Any, needle: str, css: str = "main", *, timeout: float = 10) -> None:
    """Wait until the page (once loaded after a click) shows ``needle`` in ``css``."""
    wait(driver, lambda d: needle in text(d, css), timeout=timeout, what=f"{needle!r} in {css}")


def refresh_until(driver: Any, needle: str, *, timeout: float = 15, css: str = "main") -> None:
    def seen(d: Any) -> bool:
        d.refresh()
        return needle in text(d, css)

    wait(driver, seen, timeout=timeout, what=f"{needle!r} on {driver.current_url}")


def fill_form(driver: Any, **fields: str) -> None:
    for name, value in fields.items():
        field = driver.find_element(*_by(f"#f-{name}"))
        field.clear()
        field.send_keys(value)


async def _tokens(pool: asyncpg.Pool[Any]) -> tuple[str, str]:
    a, _ = await auth.create_token(pool, owner="a")
    b, _ = await auth.create_token(pool, owner="b")
    return a, b


async def test_operator_journey(browser: Any, base: str, pool: asyncpg.Pool[Any]) -> None:
    token_a, token_b = await _tokens(pool)
    browser.get(f"{base}/login")
    screenshot(browser, "01-login")
    login(browser, base, token_a)
    see(browser, "No schedules yet")

    # Create through the form; the preview follows what is typed.
    browser.find_element(*_by("a.button.primary[href='/schedules/new']")).click()
    fill_form(browser, name="ticker", expression="*/2 * * * * *", timezone="Europe/Paris",
              prompt="Tick at {{ slot }}")  # fmt: skip
    wait(browser, lambda d: text(d, "#preview-words") == "every 2 seconds", what="the preview")
    wait(browser, lambda d: len(d.find_elements(*_by("#preview-list li"))) == 5, what="5 times")
    see(browser, "CET", "#preview-list")
    fill_form(browser, timezone="Europe/Pariss")
    wait(browser, lambda d: "did you mean 'Europe/Paris'" in text(d, "#preview-error"),
         what="the preview's error")  # fmt: skip
    fill_form(browser, timezone="Europe/Paris")
    wait(browser, lambda d: not d.find_element(*_by("#preview-error")).is_displayed(),
         what="the error to go")  # fmt: skip
    screenshot(browser, "02-new-schedule-preview")
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule created.")
    schedule_url = browser.current_url.split("?")[0]

    # A run appears and succeeds.
    refresh_until(browser, "succeeded", css="table.runs")
    screenshot(browser, "03-schedule")
    browser.find_element(*_by("table.runs a[href^='/runs/']")).click()
    see(browser, "echo: Tick at", ".output.md")
    screenshot(browser, "04-run")

    # Pause until a day far ahead, then resume.
    browser.get(schedule_url)
    browser.find_element(*_by("input[name=until]")).send_keys("2099-01-01T00:00")
    browser.find_element(*_by("input[name=reason]")).send_keys("maintenance")
    click_confirmed(browser, "form[action$='/pause'] button")
    see(browser, "Schedule paused.")
    assert "paused until Thu 01 Jan 2099 00:00 CET" in text(browser, ".subtitle")
    assert not await pool.fetchval("SELECT enabled FROM schedules WHERE name = 'ticker'")
    click_confirmed(browser, "form[action$='/resume'] button")
    see(browser, "Schedule resumed.")
    assert "enabled" in text(browser, ".subtitle")
    browser.get(f"{base}/")
    assert "ticker" in text(browser) and "every 2 seconds" in text(browser)
    screenshot(browser, "05-schedules-list")

    # A dead run, replayed after fixing its schedule.
    await _dead_run_replayed(browser, base, pool)

    # Owner B sees nothing of A's.
    browser.find_element(*_by("header .who button")).click()
    wait(browser, lambda d: d.current_url == f"{base}/login", what="logged out")
    login(browser, base, token_b)
    see(browser, "No schedules yet")
    assert "ticker" not in text(browser)
    browser.get(schedule_url)
    assert text(browser, "h1") == "Not found"
    screenshot(browser, "07-other-owner-not-found")


async def _dead_run_replayed(browser: Any, base: str, pool: asyncpg.Pool[Any]) -> None:
    browser.get(f"{base}/schedules/new")
    fill_form(browser, name="flaky", expression="@yearly", prompt="try",
              params='{"fail_attempts": 1}', max_attempts="1")  # fmt: skip
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule created.")
    flaky_url = browser.current_url.split("?")[0]
    click_confirmed(browser, "form[action$='/trigger'] button")
    see(browser, "Run created")
    refresh_until(browser, "dead", css="table.runs")
    browser.get(f"{flaky_url}/edit")
    fill_form(browser, params="{}")
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule saved.")
    browser.get(f"{base}/dead")
    assert "injected failure" in text(browser)
    screenshot(browser, "06-dead-letters")
    click_confirmed(browser, "form[action$='/replay'] button")
    see(browser, "Replay created.")
    assert "replay of run" in text(browser)
    refresh_until(browser, "succeeded", css=".subtitle")
    origins = await pool.fetch(
        "SELECT origin, status FROM runs r JOIN schedules s ON s.id = r.schedule_id "
        "WHERE s.name = 'flaky' ORDER BY r.id"
    )
    assert [tuple(r) for r in origins] == [("manual", "dead"), ("replay", "succeeded")]


async def test_markup_in_a_name_and_prompt_renders_as_text(
    browser: Any, base: str, pool: asyncpg.Pool[Any]
) -> None:
    token_a, _ = await _tokens(pool)
    login(browser, base, token_a)
    browser.get(f"{base}/schedules/new")
    fill_form(browser, name=EVIL, expression="@daily", prompt=f"Repeat {EVIL}")
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule created.")
    assert text(browser, "h1") == EVIL
    assert EVIL in text(browser, "pre.text")
    click_confirmed(browser, "form[action$='/trigger'] button")
    refresh_until(browser, "succeeded", css="table.runs")
    browser.find_element(*_by("table.runs a[href^='/runs/']")).click()
    see(browser, f"echo: Repeat {EVIL}", ".output.md")
    for url in (f"{base}/", browser.current_url):
        browser.get(url)
        assert EVIL in text(browser)
        assert browser.find_elements(*_by("main script, main img")) == []
        assert browser.execute_script("return window.__xss") is None
    screenshot(browser, "08-markup-as-text")


async def test_pages_and_confirmed_actions_work_without_javascript(
    base: str, pool: asyncpg.Pool[Any]
) -> None:
    token_a, _ = await _tokens(pool)
    with chromium(javascript=False) as driver:
        login(driver, base, token_a)
        driver.get(f"{base}/schedules/new")
        fill_form(driver, name="plain", expression="0 9 * * 1-5", prompt="hello")
        driver.find_element(*_by("button[value=preview]")).click()
        see(driver, "at 09:00 on weekdays", "#preview")
        assert len(driver.find_elements(*_by("#preview-list li"))) == 5
        driver.find_element(*_by("button[value=save]")).click()
        see(driver, "Schedule created.")
        driver.find_element(*_by("form[action$='/pause'] button")).click()
        see(driver, "Yes, pause")  # the confirmation page stands in for the dialog
        screenshot(driver, "09-confirm-without-js")
        driver.find_element(*_by("main form button")).click()
        see(driver, "Schedule paused.")
        for path in ("/", "/dead"):
            driver.get(f"{base}{path}")
            assert driver.find_element(*_by("h1")).text
