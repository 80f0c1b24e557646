"""Lanes edited in a real Chromium on one gateway replica, and live on a second one (two
replicas on one PostgreSQL: the change reaches the other by NOTIFY, its poll is an hour away):
add a lane, move it up, edit its limits (labels with units), delete it; each in the audit log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support import Gateway, sim_model, start_gateway, wait_for
from support.browser import browser_or_skip, chromium_page, doc_shot, log_in, no_csp_violations
from support.usage import written_rows

PASSWORD = "correct horse battery"
LANES = [{"name": "interactive", "match_stream": True, "max_concurrency": 4}, {"name": "standard"}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, pg_database_module: str) -> Iterator[tuple[Gateway, Gateway]]:
    browser_or_skip()
    seed = {
        "models": {"chat": sim_model("chat", max_concurrency=8)},
        "lanes": LANES,
        "tenants": {"acme": {}},
        "tasks": [{"task": "chat", "max_tokens": 300, "stop": ["###"]}],
    }
    settings: dict[str, Any] = {
        "database_url": pg_database_module,
        "admin_password": PASSWORD,
        "policy_poll_interval_s": 3600,
        "usage_flush_interval_s": 0.05,
    }
    a = start_gateway(tmp_path_factory.mktemp("a"), seed_with=seed, **settings)
    b = start_gateway(tmp_path_factory.mktemp("b"), **settings)
    b.keys = a.keys
    for gw in (a, b):
        wait_for(lambda gw=gw: gw.server.runtime.config_changes.connected, within=30, what="the replica's LISTEN")  # type: ignore[misc]
    yield a, b
    a.stop()
    b.stop()


def lanes_on(gw: Gateway) -> list[str]:
    return [lane.name for lane in gw.server.runtime.policies.current.lanes]


def lanes_used(gw: Gateway) -> list[str | None]:
    return [r.lane for r in written_rows(gw.server)]


def test_a_lane_added_moved_edited_and_deleted_in_the_browser_is_live_on_another_replica(
    pair: tuple[Gateway, Gateway],
) -> None:
    from playwright.sync_api import expect

    a, b = pair
    console: list[str] = []
    with chromium_page(a.base_url, console) as page:
        log_in(page, PASSWORD, "/admin/policies")
        add = page.locator("#add-lane")
        add.locator("summary").click()  # the add form, folded until asked for
        add.get_by_label("Name").fill("short")
        add.get_by_label("Prompts up to").fill("200")
        add.get_by_label("Streaming").select_option("false")
        add.get_by_label("Concurrency per replica").fill("3")
        add.get_by_role("button", name="Add lane").click()
        expect(page.locator("#notice")).to_contain_text("Added the lane short")
        wait_for(lambda: lanes_on(b) == ["interactive", "standard", "short"], within=10, what="b hears of the lane")

        card = page.locator("#lane-short")
        expect(card.locator(".rule")).to_have_text("Takes non-streaming requests, prompts up to 200 tokens.")
        card.get_by_role("button", name="Move short up").click()
        expect(page.locator("#notice")).to_contain_text("Moved short up")
        wait_for(lambda: lanes_on(b) == ["interactive", "short", "standard"], within=10, what="b hears of the move")
        expect(page.locator("#lane-short .badge")).to_have_text("2")

        card = page.locator("#lane-short")
        expect(card.locator(".facts")).to_contain_text("3 at once per replica")
        card.locator("summary").click()
        concurrency = card.get_by_label("Concurrency per replica")
        expect(card.locator("[id$='-max_concurrency'] .unit")).to_have_text("requests at once")
        expect(card.locator("[id$='-queue_timeout_s'] .unit")).to_have_text("seconds")
        concurrency.fill("0")  # refused in the API's words, beside the field, nothing saved
        page.evaluate("document.querySelectorAll('form').forEach(f => f.noValidate = true)")
        card.get_by_role("button", name="Save short").click()
        refusal = "max_concurrency must be a whole number, at least 1."
        expect(page.locator("#lane-short .field-error")).to_have_text(refusal)
        assert page.locator("#lane-short").get_by_label("Concurrency per replica").input_value() == "0"
        card = page.locator("#lane-short")
        card.get_by_label("Concurrency per replica").fill("6")
        card.get_by_label("Queue timeout").fill("2.5")
        card.get_by_role("button", name="Save short").click()
        expect(page.locator("#notice")).to_contain_text("Saved short")

        def edited() -> bool:
            lane = b.server.runtime.policies.current.lane("short")
            return lane is not None and (lane.max_concurrency, lane.queue_timeout_s) == (6, 2.5)

        wait_for(edited, within=10, what="b hears of the edit")
        # Live on b: a short non-streaming request now joins the new lane there.
        client = openai.OpenAI(base_url=b.api_url, api_key=a.keys["acme"], max_retries=0)
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        wait_for(lambda: lanes_used(b) == ["short"], within=10, what="b's usage row")
        doc_shot(page, "policies")

        page.once("dialog", lambda d: d.accept())
        page.locator("#lane-short").get_by_role("button", name="Delete short").click()
        expect(page.locator("#notice")).to_contain_text("Deleted the lane short")
        wait_for(lambda: lanes_on(b) == ["interactive", "standard"], within=10, what="b hears of the delete")

        page.goto("/admin/audit")
        audit = page.locator("#audit")
        for what in ("create lane short", "reorder lanes order", "update lane short", "delete lane short"):
            expect(audit).to_contain_text(what)
        edit = audit.locator("tr", has_text="update lane short")
        expect(edit.locator("li[data-field=max_concurrency]")).to_contain_text("3 → 6")
        doc_shot(page, "audit")
    no_csp_violations(console)


def test_the_policies_page_fits_a_phone(pair: tuple[Gateway, Gateway], tmp_path: Path) -> None:
    a, _ = pair
    console: list[str] = []
    with chromium_page(a.base_url, console) as page:
        log_in(page, PASSWORD, "/admin/policies")
        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        # Keyboard only: Enter on the summary opens the form, Enter in a field saves it.
        page.locator("#lane-interactive summary").focus()
        page.keyboard.press("Enter")
        page.locator("#lane-interactive").get_by_label("Prompts up to").focus()
        page.keyboard.type("100")
        page.keyboard.press("Enter")
        page.wait_for_selector("#notice")
        assert a.server.runtime.policies.current.lane("interactive").match_max_prompt_tokens == 100  # type: ignore[union-attr]
        doc_shot(page, "phone-policies")
    no_csp_violations(console)
