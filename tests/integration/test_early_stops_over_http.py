"""Early stops through the real server on the tiny llama.cpp model, with the official SDK: a
logit bias makes it say " the" forever; the chat task's repetition rule stops it with
finish_reason "stop", the engine's slot free and the decode tokens it saved counted in
/metrics and marked in the usage row. The rule is a task policy, edited live by the admin API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gguf import GGUFReader
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from prometheus_client.parser import text_string_to_metric_families
from support import Gateway, start_gateway, wait_for

PASSWORD = "correct horse battery"
MAX = 200
MSGS: Any = [{"role": "user", "content": "Say something."}]
TASKS = [
    {"task": "chat", "max_tokens": MAX, "repetition_ngram": 4, "repetition_count": 3},
    {"task": "exact", "max_tokens": MAX},  # the rule off: the answer runs to max_tokens
]


def token_id(model: Path, piece: str) -> int:
    reader = GGUFReader(model)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode() for i in field.data]
    return tokens.index(piece)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path) -> Iterator[Gateway]:
    # End of generation banned: without a stop, every answer runs to max_tokens.
    config = {"model_path": str(demo_model_path), "parallel": 2, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]}
    models = {
        "tiny": [
            {
                "name": "tiny-llamacpp",
                "engine_kind": "llamacpp",
                "quantization": "f32",
                "gpu_type": "cpu",
                "max_model_len": 512,
                "config": config,
            }
        ]
    }
    gateway = start_gateway(
        tmp_path_factory.mktemp("stops"),
        admin_password=PASSWORD,
        usage_flush_interval_s=0.05,
        seed_with={"models": models, "tasks": TASKS, "tenants": {"acme": {}}},
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def the(demo_model_path: Path) -> dict[str, int]:
    """The logit bias that makes the tiny model say " the" at every step."""
    return {str(token_id(demo_model_path, "\u2581the")): 100}


@pytest.fixture
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)


def saved_tokens(gw: Gateway) -> dict[tuple[str, str], float]:
    text = httpx.get(gw.base_url + "/metrics").text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "laneway_decode_tokens_saved")
    return {(s.labels["model"], s.labels["reason"]): s.value for s in family.samples if s.name.endswith("_total")}


def ask(client: openai.OpenAI, bias: dict[str, int], task: str = "chat", **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny", messages=MSGS, temperature=0, logit_bias=bias, extra_headers={"X-Laneway-Task": task}, **kw
    )


def test_a_loop_is_stopped_its_slot_freed_and_the_saving_counted(
    gw: Gateway, client: openai.OpenAI, the: dict[str, int]
) -> None:
    before = saved_tokens(gw).get(("tiny", "repetition"), 0.0)
    r = ask(client, the)
    choice = r.choices[0]
    # 4-grams of "the", seen 3 times: the 6th "the" ends it (seen when the 7th token starts).
    assert choice.finish_reason == "stop" and choice.message.content.split() == ["the"] * 6
    used = r.usage.completion_tokens
    assert used < 10  # the engine was cancelled: it did not decode on to max_tokens
    # llama.cpp's decoder thread drops a cancelled sequence at its next step.
    wait_for(lambda: gw.engine("tiny").active_slots == 0, what="the slot given back")
    assert saved_tokens(gw)[("tiny", "repetition")] - before == MAX - used
    rows = [row for row in gw.usage_rows("acme") if row.request_id == r.id]
    marked = [(row.early_stop, row.finish_reason, row.completion_tokens) for row in rows]
    assert marked == [("repetition", "stop", used)]

    # Streamed, the same text and the same end.
    chunks = list(ask(client, the, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    wait_for(lambda: gw.engine("tiny").active_slots == 0, what="the stream's slot given back")


def test_the_stopped_text_is_the_unstopped_text_up_to_the_stop(client: openai.OpenAI, the: dict[str, int]) -> None:
    stopped = ask(client, the).choices[0].message.content
    full = ask(client, the, task="exact").choices[0]
    assert full.finish_reason == "length" and full.message.content.startswith(stopped)
    assert len(full.message.content) > len(stopped)
    # ignore_eos (a benchmark asking for exact lengths): no early stop either.
    exact = ask(client, the, extra_body={"ignore_eos": True}, max_tokens=50)
    assert exact.choices[0].finish_reason == "length" and exact.usage.completion_tokens == 50


def test_the_rule_is_a_task_policy_edited_live(gw: Gateway, client: openai.OpenAI, the: dict[str, int]) -> None:
    admin = httpx.Client(base_url=gw.base_url + "/admin/api")
    login = admin.post("/login", json={"username": "admin", "password": PASSWORD})
    admin.headers["X-CSRF-Token"] = login.json()["csrf_token"]
    try:
        off = admin.put("/tasks/chat", json={"repetition_ngram": None})
        assert off.status_code == 200 and off.json()["repetition_ngram"] is None
        assert ask(client, the).choices[0].finish_reason == "length"  # the next request: no stop
        on = admin.put("/tasks/chat", json={"repetition_ngram": 2, "repetition_count": 2}).json()
        assert (on["repetition_ngram"], on["repetition_count"], on["json_stop"]) == (2, 2, True)
        assert ask(client, the).choices[0].message.content.split() == ["the"] * 3
        refused = [{"repetition_count": 1}, {"repetition_count": None}, {"repetition_ngram": 0}, {"json_stop": "maybe"}]
        for body in refused:
            r = admin.put("/tasks/chat", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(body)), r.text
    finally:
        admin.put("/tasks/chat", json={"repetition_ngram": 4, "repetition_count": 3})
        admin.close()
