"""An alias's replicas managed in a real Chromium against vLLM stand-ins (processes of their
own): a replica added through the vLLM typed form serves, drained it takes no new request,
removed it is gone; a replica whose engine cannot start is refused with the engine's reason
beside the field, and the alias keeps serving. Each change is in the audit log."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from support import Gateway, StandInProcess, free_port, stand_in_deployment, start_gateway, start_stand_ins
from support.browser import browser_or_skip, chromium_page, doc_shot, log_in, no_csp_violations

PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def stand_ins() -> Iterator[tuple[StandInProcess, StandInProcess]]:
    browser_or_skip()
    first, second = start_stand_ins(2)
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, stand_ins: tuple[StandInProcess, StandInProcess]) -> Iterator[Gateway]:
    models = {"m": [stand_in_deployment("m-0", stand_ins[0].base_url, max_concurrency=4)]}
    seed = {"models": models, "lanes": [{"name": "standard", "max_concurrency": 4}], "tenants": {"acme": {}}}
    gateway = start_gateway(tmp_path_factory.mktemp("replicas"), seed_with=seed, admin_password=PASSWORD)
    yield gateway
    gateway.stop()


def test_a_vllm_replica_is_added_through_its_typed_form_drained_and_removed(
    gw: Gateway, stand_ins: tuple[StandInProcess, StandInProcess]
) -> None:
    from playwright.sync_api import expect

    first, second = stand_ins
    client = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)

    def ask(n: int) -> None:
        for i in range(n):  # new conversations: the rendezvous hash spreads them over the replicas
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"Conversation {i}?"}], max_tokens=2
            )

    console: list[str] = []
    with chromium_page(gw.base_url, console) as page:
        log_in(page, PASSWORD, "/admin/models")
        page.get_by_role("link", name="m", exact=True).first.click()
        expect(page.locator("h1")).to_have_text("m")
        expect(page.locator("#replica-m-0")).to_have_attribute("data-state", "warm")
        form = page.locator("#replica-form")
        expect(form.locator("legend", has_text="vllm engine")).to_be_visible()  # the first replica's kind
        form.locator("#replica-name").fill("m-1")
        form.get_by_label("Base URL").fill(second.base_url)
        form.get_by_label("Served model name").fill("m")
        form.get_by_label("Max concurrency").fill("4")
        form.get_by_label("Metrics poll").fill("0.05")
        form.get_by_text("More vllm settings").click()  # the rest of the struct's fields, folded
        expect(form.get_by_label("Share slots through Redis")).to_be_checked()  # a checkbox, at its default
        form.get_by_label("Share slots through Redis").uncheck()
        form.get_by_role("button", name="Add replica").click()
        expect(page.locator("#notice")).to_contain_text("Added m-1 (vllm)")
        row = page.locator("#replica-m-1")
        expect(row).to_have_attribute("data-state", "warm")
        expect(row).to_have_attribute("data-health", "healthy")
        expect(row.locator(".where")).to_have_text(second.base_url)
        ask(8)
        assert second.received > 0, "the added replica served nothing"
        page.reload()  # the live figures: in flight, engine load, hit rate
        expect(page.locator("#replica-m-1 td").nth(5)).to_contain_text("running")
        doc_shot(page, "model")

        page.locator("#replica-m-1").get_by_role("button", name="Drain m-1").click()
        expect(page.locator("#notice")).to_contain_text("Draining m-1")
        expect(page.locator("#replica-m-1 .drain")).to_have_text("drained: nothing running")
        before = (first.received, second.received)
        ask(6)
        assert second.received == before[1] and first.received > before[0]  # none to the drained one

        page.once("dialog", lambda d: d.accept())
        page.locator("#replica-m-1").get_by_role("button", name="Remove m-1").click()
        expect(page.locator("#notice")).to_contain_text("Removed m-1")
        expect(page.locator("#replica-m-1")).to_have_count(0)
        assert [d.spec.name for d in gw.gateway.registry.replicas("m")] == ["m-0"]

        # An engine that cannot start: refused beside its field, in the engine's words; nothing changed.
        form = page.locator("#replica-form")
        form.locator("#replica-name").fill("m-dead")
        form.get_by_label("Base URL").fill(f"http://127.0.0.1:{free_port()}")
        form.get_by_role("button", name="Add replica").click()
        expect(page.locator("#error-config-base_url")).to_contain_text("cannot start, so nothing was changed")
        expect(page.locator("#error-config-base_url")).to_contain_text("is not healthy")
        assert page.locator("#replica-name").input_value() == "m-dead"  # as typed
        expect(page.locator("#replicas tbody tr")).to_have_count(1)
        doc_shot(page, "model-refused")
        ask(2)  # the alias keeps serving
        assert [d.spec.name for d in gw.gateway.registry.replicas("m")] == ["m-0"]

        page.goto("/admin/audit")
        audit = page.locator("#audit")
        expect(audit.locator("tr", has_text="update deployment m-1")).to_contain_text("no → yes")
        expect(audit.locator("tr", has_text="update model m")).to_have_count(2)  # added, removed
        page.goto("/admin/models")
        doc_shot(page, "models")
    no_csp_violations(console)
