"""Roles and the customer portal in a real headless Chromium: a viewer sees no form that changes
anything, and the server refuses one sent anyway; a customer logs in at /portal, issues a key
(its secret shown once), revokes it and reads its usage, limits and refusals. Screenshots land
in docs/admin/ and docs/portal/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Gateway, start_gateway
from support.accounts import PASSWORD, add_admin, add_portal_user
from support.browser import DOCS_SHOTS, browser_or_skip, chromium_page, doc_shot, no_csp_violations

PORTAL_SHOTS = DOCS_SHOTS.parent / "portal"
SIM = {"sim": [{"name": "sim-a", "engine_kind": "sim"}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    browser_or_skip()
    gw = start_gateway(
        tmp_path_factory.mktemp("roles-e2e"),
        seed_with={"models": SIM, "tenants": {"acme": {"rpm": 600, "tokens_per_day": 100_000}, "globex": {}}},
    )
    add_admin(gw.database_url, "helpdesk", "viewer")
    add_portal_user(gw.database_url, "acme", "alice", "tenant-owner")
    yield gw
    gw.stop()


def _log_in(page: object, path: str, username: str) -> None:
    page.goto(path)  # type: ignore[attr-defined]
    page.fill("input[name=username]", username)  # type: ignore[attr-defined]
    page.fill("input[name=password]", PASSWORD)  # type: ignore[attr-defined]
    page.click("button[type=submit]")  # type: ignore[attr-defined]


def test_a_viewer_sees_no_change_and_the_server_refuses_one_sent_anyway(gateway: Gateway) -> None:
    console: list[str] = []
    with chromium_page(gateway.server.base_url, console) as page:
        _log_in(page, "/admin/login", "helpdesk")
        page.goto("/admin/tenants")
        assert page.locator("#create-tenant").count() == 0
        page.click("text=acme")
        page.wait_for_url("**/admin/tenants/*")
        assert page.locator("text=Issue key").count() == 0 and page.locator("button.danger").count() == 0
        assert page.locator("fieldset[disabled] input[name=rpm]").count() == 1
        doc_shot(page, "viewer-tenant")
        page.goto("/admin/policies")
        assert page.locator("text=Add lane").count() == 0 and page.locator("text=Move up").count() == 0
        csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
        sent = page.request.post("/admin/tenants", form={"csrf_token": csrf or "", "name": "sneaky"})
        assert sent.status == 403 and sent.json()["error"]["code"] == "role_forbidden"
        page.goto("/admin/tenants")
        assert page.locator("text=sneaky").count() == 0
    no_csp_violations(console)


def test_a_customer_issues_and_revokes_a_key_and_reads_its_usage(gateway: Gateway, tmp_path: Path) -> None:
    console: list[str] = []
    with chromium_page(gateway.server.base_url, console) as page:
        _log_in(page, "/portal/login", "alice")
        page.wait_for_url("**/portal/keys")
        assert page.locator("#tenant-name").inner_text() == "acme"
        page.fill("#input-name", "ci runner")
        page.click("#create-key")
        page.wait_for_selector("#secret")
        secret = page.locator("#secret").inner_text()
        assert secret.startswith("lw-")
        doc_shot(page, "keys", PORTAL_SHOTS)
        page.reload()  # shown once: a reload shows it no more
        assert page.locator("#secret").count() == 0 and secret not in page.content()
        row = page.locator("#keys tr", has_text="ci runner")
        row.locator("button", has_text="Revoke").click()
        page.wait_for_selector("#notice")
        assert "revoked" in page.locator("#keys tr", has_text="ci runner").inner_text()
        page.goto("/portal/usage")
        assert page.locator("#limits").count() == 1 and page.locator("#refusals").count() == 1
        assert "100000" in page.locator("#quota-day").inner_text()
        doc_shot(page, "usage", PORTAL_SHOTS)
    no_csp_violations(console)
