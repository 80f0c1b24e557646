"""The admin UI in a real headless Chromium (Debian's chromium driven by Playwright): log in,
create a tenant, issue a key, lower its RPM, and see a request with that key get 429, all
without restarting the gateway; a tenant's usage page and CSV against requests made with the
openai SDK; every page at a phone's 390 px. A screenshot of each page lands in docs/admin/ (the
ones docs/admin.md shows) or the module's temporary directory (pytest prints where: screenshots-*)."""

from __future__ import annotations

import csv
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support import ServerThread, start_gateway, unavailable
from support.browser import doc_shot

PASSWORD = "correct horse battery"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CONSOLE: list[str] = []  # what the browser logged, across the module's tests


def _browser_or_skip() -> None:
    if os.path.exists(CHROMIUM):
        return
    unavailable(
        "Chromium is not installed (apt-get install chromium) - browser tests skipped",
        "Chromium is not installed (CI=true: .ci/run installs Debian's chromium)",
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    _browser_or_skip()
    sim = {"sim": [{"name": "sim-a", "engine_kind": "sim"}]}
    gw = start_gateway(tmp_path_factory.mktemp("e2e"), seed_with={"models": sim}, admin_password=PASSWORD)
    yield gw.server
    gw.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def page(server: ServerThread) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        context = browser.new_context(base_url=server.base_url, accept_downloads=True)
        # Report every Content-Security-Policy violation (Chromium also logs "Refused to ...").
        context.add_init_script(
            "document.addEventListener('securitypolicyviolation', e => console.error("
            "'CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI));"
        )
        page = context.new_page()
        page.on("console", lambda msg: CONSOLE.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda exc: CONSOLE.append(f"pageerror: {exc}"))
        yield page
        browser.close()


def test_admin_lowers_a_tenants_rpm_and_its_next_request_gets_429(
    server: ServerThread, page: object, shots: Path
) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    response = page.goto("/admin/")
    assert response is not None and "script-src 'self'" in response.headers["content-security-policy"]
    expect(page).to_have_url(f"{server.base_url}/admin/login")
    # The stylesheet (from /admin/static, not inline) applies under the CSP.
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(246, 247, 249)"
    doc_shot(page, "login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "wrong password")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("Wrong username or password")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{server.base_url}/admin/dashboard")  # login lands on the live view

    page.goto("/admin/tenants")
    page.fill("fieldset input[name=name]", "acme")
    page.fill("fieldset input[name=rpm]", "100")
    page.click("text=Create tenant")
    expect(page.locator("h1")).to_have_text("Tenant acme")
    page.click("text=Issue key")
    secret = page.locator("#secret").inner_text()
    assert secret.startswith("lw-")
    page.screenshot(path=shots / "tenant-with-new-key.png", full_page=True)

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=secret, max_retries=0)

    def ask() -> object:
        return client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2)

    ask()
    page.fill("fieldset input[name=rpm]", "1")
    page.click("fieldset >> text=Save")
    expect(page.locator("#notice")).to_contain_text("Saved")
    assert page.locator("fieldset input[name=rpm]").input_value() == "1"
    ask()  # the lowered bucket (capacity 1) still holds one
    with pytest.raises(openai.RateLimitError) as info:
        ask()
    assert int(info.value.response.headers["retry-after"]) >= 1

    page.goto("/admin/tenants")
    expect(page.locator("#tenants")).to_contain_text("acme")
    doc_shot(page, "tenants")
    page.goto("/admin/tenants/1")
    asked: list[str] = []

    def answer(accept: bool) -> None:
        page.once("dialog", lambda d: (asked.append(d.message), d.accept() if accept else d.dismiss()))

    answer(False)  # a second thought: nothing is revoked
    page.click("text=Revoke")
    assert asked and asked[0].startswith("Revoke the key")
    with pytest.raises(openai.RateLimitError):  # still a valid key (rate limited, not 401)
        ask()
    expect(page.locator("#keys")).not_to_contain_text("revoked")
    answer(True)
    page.click("text=Revoke")
    expect(page.locator("#keys")).to_contain_text("revoked")
    with pytest.raises(openai.AuthenticationError):
        ask()
    page.screenshot(path=shots / "tenant-key-revoked.png", full_page=True)


def test_forms_without_the_csrf_token_are_refused(server: ServerThread, page: object) -> None:
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    status = page.evaluate(
        """async () => (await fetch('/admin/tenants', {method: 'POST',
             headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: 'name=evil'})).status"""
    )
    assert status == 403


def test_every_page_renders_and_policy_edits_validate_inline(server: ServerThread, page: object, shots: Path) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    page.goto("/admin/policies")
    if "/login" in page.url:  # a fresh context in isolation: log in first
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.goto("/admin/policies")
    # The seeded default lane set is empty here: create one, then break it on purpose.
    page.goto("/admin/models")
    expect(page.locator("#models")).to_contain_text("sim-a")
    page.screenshot(path=shots / "models.png", full_page=True)

    import httpx

    admin = httpx.Client(base_url=server.base_url + "/admin/api")
    csrf = admin.post("/login", json={"username": "admin", "password": PASSWORD}).json()["csrf_token"]
    admin.put("/lanes/interactive", json={"position": 0, "match_stream": True}, headers={"X-CSRF-Token": csrf})
    admin.put("/tasks/chat", json={"max_tokens": 384}, headers={"X-CSRF-Token": csrf})

    page.goto("/admin/policies")
    lane = page.locator("#lane-interactive")
    lane.locator("summary").click()  # the edit form, folded under the lane's summary
    page.evaluate("document.querySelectorAll('form').forEach(f => f.noValidate = true)")  # the server's check
    lane.locator("input[name=max_concurrency]").fill("0")
    lane.get_by_role("button", name="Save interactive").click()
    expect(page.locator("#lane-interactive .error")).to_contain_text("max_concurrency")
    page.screenshot(path=shots / "policies-invalid.png", full_page=True, caret="initial")
    page.locator("#lane-interactive input[name=max_concurrency]").fill("6")  # still open, as typed
    page.locator("#lane-interactive").get_by_role("button", name="Save interactive").click()
    expect(page.locator("#notice")).to_contain_text("Saved interactive")
    assert server.runtime.policies.current.lane("interactive").max_concurrency == 6  # live, no restart
    task = page.locator("#task-chat")
    task.locator("summary").click()
    task.locator("input[name=stop]").nth(0).fill("###")  # one box per stop sequence
    task.locator("input[name=stop]").nth(1).fill("END")
    task.get_by_role("button", name="Save chat").click()
    expect(page.locator("#notice")).to_contain_text("Saved chat")
    assert server.runtime.policies.current.tasks["chat"].stop == ("###", "END")
    page.screenshot(path=shots / "policies.png", full_page=True)

    page.goto("/admin/dashboard")
    expect(page.locator("#queues")).to_contain_text("sim-a")
    expect(page.locator("#ttft")).to_contain_text("p99")
    page.wait_for_selector("#ttft-chart", timeout=10_000)  # requests of the first test, after the 2 s poll
    doc_shot(page, "dashboard")

    page.goto("/admin/audit")
    expect(page.locator("#audit")).to_contain_text("update lane interactive")
    page.screenshot(path=shots / "audit.png", full_page=True)


def _tenant_with_key(server: ServerThread, name: str, **limits: Any) -> tuple[int, str]:
    import httpx

    admin = httpx.Client(base_url=server.base_url + "/admin/api")
    csrf = admin.post("/login", json={"username": "admin", "password": PASSWORD}).json()["csrf_token"]
    headers = {"X-CSRF-Token": csrf}
    tenant = admin.post("/tenants", json={"name": name, **limits}, headers=headers).json()
    key = admin.post(f"/tenants/{tenant['id']}/keys", json={"name": "e2e"}, headers=headers).json()
    return int(tenant["id"]), str(key["secret"])


def test_usage_page_and_csv_match_requests_made_with_the_sdk(
    server: ServerThread, page: object, shots: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    tenant_id, secret = _tenant_with_key(server, "usage-co", rpm=5)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=secret, max_retries=0)
    refused = 0
    for i in range(7):  # rpm 5: the last two are 429s, and count as errors
        try:
            client.chat.completions.create(
                model="sim", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2 + i, user='e2e, "quoted"'
            )
        except openai.RateLimitError:
            refused += 1
    assert refused == 2
    server.call(server.runtime.recorder.flush())  # the batch writer's next tick, now

    _logged_in(page, "/admin/dashboard")
    page.goto(f"/admin/tenants/{tenant_id}")
    page.click("#usage-link")
    expect(page.locator("h1")).to_contain_text("Usage of usage-co")
    expect(page.locator("[data-figure=requests]")).to_have_text("7")
    expect(page.locator("[data-figure=errors]")).to_have_text("2")
    assert page.locator("#requests-chart rect.bar").count() >= 2  # successes and errors, stacked
    assert page.locator("#ttft-chart circle").count() >= 1
    expect(page.locator("#usage-errors")).to_contain_text("rate_limit_exceeded")
    doc_shot(page, "usage")
    page.click("#period-hour")
    expect(page.locator("#period-hour")).to_have_attribute("aria-current", "page")
    expect(page.locator("[data-figure=requests]")).to_have_text("7")
    # The panel refreshes itself (htmx): a new request shows up without a reload.
    with pytest.raises(openai.RateLimitError):  # refused, and still a usage row
        client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "one more"}], max_tokens=2)
    server.call(server.runtime.recorder.flush())
    expect(page.locator("[data-figure=requests]")).to_have_text("8", timeout=15_000)
    page.screenshot(path=shots / "usage-hour.png", full_page=True)

    with page.expect_download() as info:
        page.click("#usage-csv")
    download = info.value
    assert re.fullmatch(r"usage-usage-co-hour-\d{8}T\d{6}Z\.csv", download.suggested_filename)
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    parsed = list(csv.DictReader(saved.open(newline="")))
    rows = sorted(_usage_rows(server, tenant_id), key=lambda r: (r.created_at, r.id))
    assert [p["request_id"] for p in parsed] == [r.request_id for r in rows] and len(rows) == 8
    assert [int(p["status"]) for p in parsed].count(429) == 3
    assert [int(p["completion_tokens"]) for p in parsed] == [r.completion_tokens for r in rows]
    assert {p["end_user"] for p in parsed} == {'e2e, "quoted"', ""}


def _usage_rows(server: ServerThread, tenant_id: int) -> list[Any]:
    from laneway.db.repositories import UsageRepository

    async def read() -> list[Any]:
        async with server.runtime.sessions() as s:
            return await UsageRepository(s).for_tenant(tenant_id)

    return list(server.call(read()))


def test_a_rejected_form_keeps_its_values_and_disabling_asks_first(
    server: ServerThread, page: object, shots: Path
) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    _logged_in(page, "/admin/dashboard")
    page.goto("/admin/tenants")
    expect(page.locator("#help-rpm")).to_contain_text("Blank = unlimited")
    expect(page.locator("#field-tpm .unit")).to_have_text("tokens / min")
    form = page.locator("#create-tenant")
    form.locator("input[name=name]").fill("acme")  # taken: only the server knows
    form.locator("input[name=rpm]").fill("17")
    form.locator("input[name=max_concurrency]").fill("3")
    form.locator("button").click()
    expect(page.locator("#create-error")).to_contain_text("acme")
    assert form.locator("input[name=name]").input_value() == "acme"
    assert form.locator("input[name=rpm]").input_value() == "17"
    assert form.locator("input[name=max_concurrency]").input_value() == "3"
    page.screenshot(path=shots / "tenants-rejected.png", full_page=True)

    tenant_id, _ = _tenant_with_key(server, "form-co", rpm=9)
    page.goto(f"/admin/tenants/{tenant_id}")
    # A client that does not validate (or an old browser) sends what the browser would refuse.
    page.evaluate("document.querySelectorAll('form').forEach(f => f.noValidate = true)")
    page.fill("fieldset input[name=rpm]", "0")
    page.fill("fieldset input[name=tpm]", "1234")
    page.click("fieldset >> text=Save")
    expect(page.locator("#error-rpm")).to_have_text(
        "Requests per minute must be a whole number from 1 to 2,147,483,647, or blank for unlimited."
    )
    assert page.locator("fieldset input[name=rpm]").input_value() == "0"
    assert page.locator("fieldset input[name=tpm]").input_value() == "1234"
    assert page.locator("fieldset input[name=rpm]").get_attribute("aria-invalid") == "true"
    page.screenshot(path=shots / "tenant-rejected.png", full_page=True)

    page.goto(f"/admin/tenants/{tenant_id}")
    page.check("fieldset input[name=disabled]")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.click("fieldset >> text=Save")
    assert asked and asked[0].startswith("Disable form-co?")
    expect(page.locator("#notice")).to_have_count(0)  # not saved
    page.once("dialog", lambda d: d.accept())
    page.click("fieldset >> text=Save")
    expect(page.locator("#notice")).to_contain_text("Saved")
    assert page.locator("fieldset input[name=disabled]").is_checked()
    page.once("dialog", lambda d: pytest.fail(f"asked again: {d.message}"))
    page.click("fieldset >> text=Save")  # already disabled: a save does not ask
    expect(page.locator("#notice")).to_contain_text("Saved")

    page.goto("/admin/audit")
    updates = page.locator("#audit tr", has_text=f"update tenant {tenant_id}")
    entry = updates.filter(has=page.locator("li[data-field=disabled]")).first
    expect(entry.locator(".actor")).to_have_text("admin")
    expect(entry.locator("li[data-field=disabled]")).to_contain_text("no → yes")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry.locator("time").inner_text())


PHONE_PAGES = [
    ("dashboard", "/admin/dashboard"),
    ("tenants", "/admin/tenants"),
    ("tenant", "/admin/tenants/1"),
    ("usage", "/admin/tenants/1/usage"),
    ("policies", "/admin/policies"),
    ("models", "/admin/models"),
    ("audit", "/admin/audit"),
    ("model", "/admin/models/alias?name=sim"),
    ("route", "/admin/route"),
]


def test_every_page_fits_a_390px_screen(server: ServerThread, page: object, shots: Path) -> None:
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    _logged_in(page, "/admin/dashboard")
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        for name, path in PHONE_PAGES:
            page.goto(path)
            assert page.evaluate("document.querySelector('meta[name=viewport]') !== null"), name
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{name} is {width} px wide"
            nav = page.evaluate("document.querySelector('header').scrollWidth")
            assert nav <= 390, f"{name}: the nav is {nav} px wide"
            doc_shot(page, f"phone-{name}")
        page.goto("/admin/login")  # logged in: the login form itself, for the screenshot
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        page.set_viewport_size({"width": 1280, "height": 720})


def _logged_in(page: Any, path: str) -> None:
    page.goto(path)
    if "/login" in page.url:  # a fresh context in isolation: log in first
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.goto(path)


def test_quotas_and_key_limits_save_and_show_usage(server: ServerThread, page: object, shots: Path) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    import httpx

    admin = httpx.Client(base_url=server.base_url + "/admin/api")
    csrf = admin.post("/login", json={"username": "admin", "password": PASSWORD}).json()["csrf_token"]
    admin.headers["X-CSRF-Token"] = csrf
    tenant = admin.post("/tenants", json={"name": "quota-co", "rpm": 50}).json()
    secret = admin.post(f"/tenants/{tenant['id']}/keys", json={"name": "ui-key"}).json()["secret"]

    _logged_in(page, f"/admin/tenants/{tenant['id']}")
    expect(page.locator("#quota-help")).to_contain_text("00:00 UTC")
    page.fill("fieldset input[name=tokens_per_day]", str(10**16))  # past what the server takes (the browser checks min)
    page.click("fieldset >> text=Save")
    expect(page.locator("#edit-error")).to_contain_text("tokens_per_day must be a whole number of tokens from 1 to 1,")
    page.fill("fieldset input[name=tokens_per_day]", "1000")
    page.fill("fieldset input[name=tokens_per_month]", "20000")
    page.click("fieldset >> text=Save")
    expect(page.locator("#notice")).to_contain_text("Saved")
    assert page.locator("fieldset input[name=tokens_per_day]").input_value() == "1000"
    assert server.runtime.gateway is not None

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=secret, max_retries=0)
    used = sum(
        client.completions.create(model="sim", prompt="hello", max_tokens=5).usage.total_tokens for _ in range(3)
    )
    page.reload()
    expect(page.locator("#usage-day .used")).to_have_text(f"{used:,} tokens")
    expect(page.locator("#usage-day")).to_contain_text("1,000 tokens")
    expect(page.locator("#usage-month")).to_contain_text("20,000 tokens")
    doc_shot(page, "tenant")

    row = page.locator("#keys tr", has_text="ui-key")
    row.locator("input[name=rpm]").fill("80")  # above the tenant's 50: refused on the row, in words
    row.locator("text=Save key limits").click()
    row = page.locator("#keys tr", has_text="ui-key")
    expect(row.locator(".key-error")).to_contain_text("above tenant 'quota-co''s RPM of 50")
    row.locator("input[name=rpm]").fill("2")
    row.locator("input[name=allowed_models]").fill("sim")
    row.locator("text=Save key limits").click()
    expect(page.locator("#notice")).to_contain_text("Saved the key's limits")
    row = page.locator("#keys tr", has_text="ui-key")
    assert row.locator("input[name=rpm]").input_value() == "2"
    assert row.locator("input[name=allowed_models]").input_value() == "sim"
    page.screenshot(path=shots / "tenant-key-limits.png", full_page=True)
    client.completions.create(model="sim", prompt="hello", max_tokens=5)
    client.completions.create(model="sim", prompt="hello", max_tokens=5)
    with pytest.raises(openai.RateLimitError) as info:  # the key's 2/min, inside the tenant's 50
        client.completions.create(model="sim", prompt="hello", max_tokens=5)
    assert "this API key" in info.value.response.json()["error"]["message"]


def test_the_browser_reported_no_csp_violations(server: ServerThread, page: object) -> None:
    """Run last: every page above loaded (and htmx swapped) under the CSP without a violation."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    page.goto("/admin/dashboard")
    if "/login" in page.url:  # run in isolation: log in first
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.goto("/admin/dashboard")
    page.wait_for_selector("#panel")
    with page.expect_response(lambda r: "/admin/dashboard/panel" in r.url, timeout=10_000):
        pass  # one htmx poll of the panel
    violations = [m for m in CONSOLE if "CSP violation" in m or "Content Security Policy" in m or "Refused to" in m]
    assert not violations, violations
    assert not [m for m in CONSOLE if m.startswith("pageerror")], CONSOLE
