"""Headless Chromium for the browser tests: Debian's `chromium` and `chromium-driver`, driven by selenium.

`.ci/run` installs both packages; elsewhere the tests that need them skip and say how to install them,
unless GPUCOURSE_REQUIRE_BROWSER=1 (set by `.ci/run` when CI=true), which makes a missing browser a failure.
On a failure, `screenshot_on_failure` saves what the browser showed under `tests/screenshots/`.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import REQUIRE_BROWSER

SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
# Flags for a closed network and a root user: no sandbox, no background connections, a fresh profile.
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000"]


def chromium_paths() -> tuple[str, str]:
    """The browser and its driver, or a pytest skip naming the packages to install."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        why = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        if REQUIRE_BROWSER:  # CI: a missing browser is a failure
            pytest.fail(f"GPUCOURSE_REQUIRE_BROWSER=1 but the browser test {why}")
        pytest.skip(why)
    return browser, driver


@contextlib.contextmanager
def chrome():
    """A headless Chromium session with its own empty profile, closed on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="gpucourse-chrome-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            yield driver
        finally:
            driver.quit()


@contextlib.contextmanager
def screenshot_on_failure(driver, name: str):
    """Save ``tests/screenshots/<name>.png`` (and the page's HTML) if the block raises."""
    try:
        yield
    except BaseException:
        SCREENSHOTS.mkdir(exist_ok=True)
        with contextlib.suppress(Exception):
            driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
            (SCREENSHOTS / f"{name}.html").write_text(driver.page_source)
        raise
