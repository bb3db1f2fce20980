"""Fixtures for the browser tests: Debian's chromium driven headless by Playwright.
(Servers, tiny or scripted, are the session fixtures of tests/conftest.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")  # Debian's (make browser); Playwright never downloads one
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[object]:
    """A page of a fresh headless chromium profile; uncaught page errors fail the test."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (make browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1500, "height": 950},
        )
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(20_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield page
        finally:
            context.close()
        assert not errors, f"uncaught errors in the page: {errors}"
