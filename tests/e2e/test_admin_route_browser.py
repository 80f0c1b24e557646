"""The route tester in a real Chromium gives the lane and max_tokens a real request of the same
shape gets: the test asks the page, then sends that request with the openai SDK to a vLLM
stand-in, and compares the page's answer with the usage row's lane and the max_tokens the
engine received. Described and pasted requests alike; a refusal is said in the API's words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from support import Gateway, StandInProcess, stand_in_deployment, start_gateway
from support.browser import browser_or_skip, chromium_page, doc_shot, log_in, no_csp_violations
from support.usage import written_rows

PASSWORD = "correct horse battery"
LANES = [
    {"name": "interactive", "match_stream": True, "match_max_prompt_tokens": 120, "max_concurrency": 4},
    {"name": "bulk", "match_tasks": ["summarize"]},
    {"name": "standard"},
]
TASKS = [
    {"task": "chat", "max_tokens": 300, "long_prompt_tokens": 100, "long_prompt_max_tokens": 40, "stop": ["###"]},
    {"task": "summarize", "max_tokens": 120},
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, StandInProcess]]:
    browser_or_skip()
    engine = StandInProcess()
    models = {"m": [stand_in_deployment("m-0", engine.base_url, max_concurrency=8)]}
    seed = {"models": models, "lanes": LANES, "tasks": TASKS, "tenants": {"acme": {"tokens_per_day": 100_000}}}
    gw = start_gateway(tmp_path_factory.mktemp("route"), seed_with=seed, admin_password=PASSWORD)
    yield gw, engine
    gw.stop()
    engine.stop()


def words(n: int) -> str:
    return " ".join(["the"] * n)  # the route tester's described prompt


def test_the_route_tester_agrees_with_real_requests_of_the_same_shape(setup: tuple[Gateway, StandInProcess]) -> None:
    from playwright.sync_api import expect

    gw, engine = setup
    client = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)

    def real(stream: bool, task: str | None, **body: Any) -> tuple[str | None, int]:
        """(the lane of its usage row, the max_tokens the engine received) of a real request."""
        headers = {"X-Laneway-Task": task} if task else {}
        answer = client.chat.completions.create(model="m", stream=stream, extra_headers=headers, **body)
        if stream:
            for _ in answer:  # type: ignore[union-attr]
                pass
        return written_rows(gw.server)[-1].lane, int(engine.bodies()[-1]["max_tokens"])

    cases = [(30, True, "chat", ""), (200, False, "chat", ""), (30, False, "summarize", "500"), (30, True, "", "7")]
    console: list[str] = []
    with chromium_page(gw.base_url, console) as page:
        log_in(page, PASSWORD, "/admin/route")
        for prompt, stream, task, asked in cases:
            form = page.locator("#describe")
            form.get_by_label("Tenant").fill("acme")
            form.get_by_label("Model").select_option("m")
            form.get_by_label("Prompt length").fill(str(prompt))
            form.get_by_label("Streaming (stream: true)").set_checked(stream)
            form.get_by_label("Task").fill(task)
            form.get_by_label("max_tokens").fill(asked)
            page.evaluate("document.getElementById('route-answer')?.remove()")  # so the next one seen is new
            form.get_by_role("button", name="Where would it go?").click()
            expect(page.locator("#route-answer")).to_be_visible()
            shown = (page.locator("#route-lane").inner_text(), int(page.locator("#route-max-tokens").inner_text()))
            body: dict[str, Any] = {"messages": [{"role": "user", "content": words(prompt)}]}
            if asked:
                body["max_tokens"] = int(asked)
            assert shown == real(stream, task or None, **body), (prompt, stream, task, asked)
            if (prompt, task) == (200, "chat"):
                expect(page.locator("#route-stops")).to_have_text("###")
                expect(page.locator("#route-quota-day")).to_contain_text("of 100,000 tokens left")
                expect(page.locator("#route-pick")).to_have_text("m-0")
                doc_shot(page, "route")

        # A pasted body, with its own max_tokens: the same answer as the request itself.
        pasted = {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Summarize: " + words(50)},
            ],
            "max_tokens": 90,
        }
        form = page.locator("#paste")
        form.get_by_label("Tenant").fill("acme")
        form.get_by_label("Body (JSON)").fill(json.dumps(pasted))
        form.get_by_label("X-Laneway-Task").fill("summarize")
        form.get_by_role("button", name="Where would it go?").click()
        expect(page.locator("#route-lane")).to_have_text("bulk")
        shown = ("bulk", int(page.locator("#route-max-tokens").inner_text()))
        assert shown == real(False, "summarize", messages=pasted["messages"], max_tokens=90) == ("bulk", 90)

        form = page.locator("#paste")  # what laneway would refuse, in the API's words
        form.get_by_label("Body (JSON)").fill(
            '{"model": "m", "messages": [{"role": "user", "content": "x"}], "tempratur": 1}'
        )
        form.get_by_role("button", name="Where would it go?").click()
        expect(page.locator("#route-refusal")).to_have_text("400 unknown_parameter")
        expect(page.locator("#route-answer")).to_contain_text("Unknown parameter: 'tempratur'.")
    no_csp_violations(console)
