"""Headless Chromium for the console's browser tests: Debian's chromium and chromedriver
driven by Selenium, a fresh profile per session, screenshots under build/screenshots/."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "build" / "screenshots"
CHROMIUM = os.environ.get("PROMPTSCHED_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PROMPTSCHED_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--disable-extensions", "--window-size=1280,900",
)  # fmt: skip
HOW_TO_INSTALL = (
    "the console's browser tests need Chromium, chromedriver and Selenium. On Debian or "
    "Ubuntu run `make browser-deps` (apt-get install -y chromium chromium-driver); elsewhere "
    "install Chromium and its matching chromedriver and point PROMPTSCHED_CHROMIUM and "
    "PROMPTSCHED_CHROMEDRIVER at them; Selenium comes with `pip install -e '.[dev]'`. "
    "To leave these tests out on purpose: pytest -m 'not browser'."
)

T = TypeVar("T")


def require_browser() -> None:
    """Fail (not skip) with what to install when the browser or its driver is missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: {HOW_TO_INSTALL}", pytrace=False)
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.fail(f"selenium is not installed: {HOW_TO_INSTALL}", pytrace=False)


@contextmanager
def chromium(*, javascript: bool = True) -> Iterator[Any]:
    """A headless Chromium session with a fresh profile, closed afterwards."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    profile = tempfile.mkdtemp(prefix="pst-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    if not javascript:
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2}
        )
    log = Path(profile) / "chromedriver.log"
    driver = webdriver.Chrome(
        options=options, service=DriverService(executable_path=CHROMEDRIVER, log_output=str(log))
    )
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: Any, name: str) -> Path:
    """The whole page, not only the window, as build/screenshots/NAME.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path = SCREENSHOTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def wait(driver: Any, condition: Callable[[Any], T], *, timeout: float = 10, what: str = "") -> T:
    """Poll ``condition(driver)`` until it is truthy (Selenium's wait, with a clear message)."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    def polled(d: Any) -> Any:
        try:
            return condition(d)
        except WebDriverException as exc:
            # Chromium's other word for a stale element, when the page reloads mid-read.
            if "does not belong to the document" in str(exc.msg or ""):
                return False
            raise

    # A page reloading under the poll leaves stale or missing elements: poll again.
    ignored = (NoSuchElementException, StaleElementReferenceException)
    result: T = WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored
    ).until(polled, message=f"timed out after {timeout}s waiting for {what}")
    return result
