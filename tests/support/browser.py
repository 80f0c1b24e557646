"""Chromium through Playwright for the admin UI's end-to-end tests: Debian's chromium (skipped
when missing, failed under CI=true), a page that records what the browser logged (CSP
violations included), logging in, and the screenshots docs/admin.md shows (docs/admin/)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.services import unavailable

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "admin"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def browser_or_skip() -> None:
    if not os.path.exists(CHROMIUM):
        unavailable(
            "Chromium is not installed (apt-get install chromium) - browser tests skipped",
            "Chromium is not installed (CI=true: .ci/run installs Debian's chromium)",
        )


@contextmanager
def chromium_page(base_url: str, console: list[str]) -> Iterator[Any]:
    """A fresh headless Chromium page on `base_url`; what the browser logs goes to `console`."""
    from playwright.sync_api import sync_playwright

    browser_or_skip()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 800})
        context.add_init_script(
            "document.addEventListener('securitypolicyviolation', e => console.error("
            "'CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI));"
        )
        page = context.new_page()
        page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda exc: console.append(f"pageerror: {exc}"))
        try:
            yield page
        finally:
            browser.close()


def log_in(page: Any, password: str, path: str = "/admin/dashboard") -> None:
    page.goto(path)
    if "/login" in page.url:
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", password)
        page.click("button[type=submit]")
        page.goto(path)


def doc_shot(page: Any, name: str, folder: Path = DOCS_SHOTS) -> None:
    """The page as docs/admin.md shows it (docs/admin/NAME.png; `folder`: another page's
    docs/ folder, e.g. docs/portal/), taken by the test run."""
    folder.mkdir(parents=True, exist_ok=True)
    # caret="initial": Playwright's caret hiding leaves style="" on inputs, which htmx would
    # then carry across the next swap and the CSP refuse.
    page.screenshot(path=folder / f"{name}.png", full_page=True, caret="initial")


def no_csp_violations(console: list[str]) -> None:
    violations = [m for m in console if "CSP violation" in m or "Content Security Policy" in m or "Refused to" in m]
    assert not violations, violations
    assert not [m for m in console if m.startswith("pageerror")], console
