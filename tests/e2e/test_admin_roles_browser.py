"""Engine swaps on the alias page in a real Chromium: a replica made a canary through the Roles
panel takes sessions, a weight out of range is refused beside it naming the field, the Compare
view shows the serving pool beside the canary with their request counts, a rollback takes the
canary out, and promoting a candidate makes it the serving pool. Screenshots for docs/admin.md."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from support import Gateway, start_gateway, wait_for
from support.browser import browser_or_skip, chromium_page, doc_shot, log_in, no_csp_violations

PASSWORD = "correct horse battery"
SIM = {"max_concurrency": 4, "decode_ms_base": 2.0}


def sim(name: str) -> dict[str, object]:
    return {"name": name, "engine_kind": "sim", "quantization": "sim", "gpu_type": "sim", "config": SIM}


@pytest.fixture
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    browser_or_skip()
    seed = {"models": {"m": [sim("m-a"), sim("m-b")]}, "tenants": {"acme": {}}}
    gateway = start_gateway(tmp_path_factory.mktemp("roles"), seed_with=seed, admin_password=PASSWORD)
    yield gateway
    gateway.stop()


def test_a_canary_is_set_compared_rolled_back_and_a_candidate_promoted_on_the_alias_page(gw: Gateway) -> None:
    from playwright.sync_api import expect

    client = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    console: list[str] = []
    with chromium_page(gw.base_url, console) as page:
        page.on("dialog", lambda dialog: dialog.accept())  # the promote's confirmation
        log_in(page, PASSWORD, "/admin/models/alias?name=m")
        row = page.locator("#role-m-b")
        expect(row).to_have_attribute("data-role", "serving")

        row.get_by_label("Role of m-b", exact=True).select_option("canary")
        row.get_by_label("Weight of m-b", exact=True).fill("150")
        row.get_by_role("button", name="Set the role of m-b").click()
        expect(page.locator("#role-m-b .row-error")).to_contain_text("weight")
        expect(page.locator("#role-m-b")).to_have_attribute("data-role", "serving")  # nothing changed

        row = page.locator("#role-m-b")
        row.get_by_label("Role of m-b", exact=True).select_option("canary")
        row.get_by_label("Weight of m-b", exact=True).fill("50")
        row.get_by_role("button", name="Set the role of m-b").click()
        expect(page.locator("#roles-notice")).to_contain_text("m-b is now canary")
        expect(page.locator("#role-m-b")).to_have_attribute("data-role", "canary")

        for i in range(30):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"Conversation {i}?"}], max_tokens=2
            )
        compare = page.locator("#compare-pools")
        expect(compare).to_be_visible(timeout=10_000)
        expect(compare.locator("thead")).to_contain_text("m-b (canary)")
        counts = compare.locator("tbody tr").first.locator("td")
        wait_for(lambda: sum(int(t) for t in counts.all_inner_texts()) == 30, within=15, what="30 compared")
        doc_shot(page, "model-compare")

        page.locator("#role-m-b").get_by_role("button", name="Roll back m-b").click()
        expect(page.locator("#roles-notice")).to_contain_text("Rolled back m-b")
        expect(page.locator("#role-m-b td").first).to_contain_text("canary, weight 0 %")

        page.locator("#role-m-b").get_by_role("button", name="Promote m-b").click()
        expect(page.locator("#roles-notice")).to_contain_text("m-b now serves m")
        expect(page.locator("#role-m-b")).to_have_attribute("data-role", "serving")
        expect(page.locator("#role-m-a")).to_have_count(0)
    no_csp_violations(console)
    served = {d.spec.name for d in gw.gateway.registry.replicas("m")}
    assert served == {"m-b"}
