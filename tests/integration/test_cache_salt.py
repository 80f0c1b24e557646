"""Tenant-safe prefix caching on vLLM: every generation reaches vLLM with its tenant's own
`cache_salt` (vLLM reuses cached prompt blocks only within one salt, so a tenant cannot time
another's prompts), never with a salt the client sent, which the gateway drops without a word.
The vLLM stand-in runs as a process of its own on loopback and reports the bodies it got."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support import Gateway, StandInProcess, sim_model, start_gateway

CLIENT_SALT = {"cache_salt": "chosen-by-the-client"}


@pytest.fixture
def standin() -> Iterator[StandInProcess]:
    process = StandInProcess()
    yield process
    process.stop()


def vllm(name: str, base_url: str, **config: Any) -> list[dict[str, Any]]:
    config = {"base_url": base_url, "model": "m", "metrics_poll_s": 0.05, "shared_slots": False, **config}
    return [{"name": name, "engine_kind": "vllm", "max_model_len": 4096, "config": config}]


def ask_everything(client: openai.OpenAI, alias: str, tag: str) -> None:
    """Chat (whole and streamed), completions and Responses, each once with a salt of the
    client's and once without; the X-Request-Id says whose request vLLM got."""
    for i, extra in enumerate((CLIENT_SALT, {})):
        headers = {"X-Request-Id": f"{tag}-{i}"}
        messages = [{"role": "user", "content": "the same long system prompt and a question"}]
        client.chat.completions.create(
            model=alias,
            messages=messages,
            max_tokens=2,  # type: ignore[arg-type]
            extra_body=extra,
            extra_headers=headers,
        )
        streamed = client.chat.completions.create(
            model=alias,
            messages=messages,
            max_tokens=2,
            stream=True,  # type: ignore[arg-type]
            extra_body=extra,
            extra_headers=headers,
        )
        assert [c for c in streamed]
        client.completions.create(
            model=alias, prompt="the same prompt", max_tokens=2, extra_body=extra, extra_headers=headers
        )
        client.responses.create(
            model=alias, input="the same input", max_output_tokens=16, extra_body=extra, extra_headers=headers
        )


async def test_each_tenant_reaches_vllm_with_its_own_salt_never_the_clients(
    tmp_path: Path, standin: StandInProcess
) -> None:
    models = {
        "m": vllm("m-vllm", standin.base_url),
        # A deployment's own extra_body cannot set the salt either: the tenant's wins.
        "m-extra": vllm("m-extra-vllm", standin.base_url, extra_body={"cache_salt": "from-the-deployment"}),
        "sim": sim_model("sim"),
    }
    gw: Gateway = await asyncio.to_thread(
        start_gateway, tmp_path, seed_with={"models": models, "tenants": {"acme": {}, "globex": {}}}
    )
    try:
        clients = {t: openai.OpenAI(base_url=gw.api_url, api_key=gw.keys[t], max_retries=0) for t in ("acme", "globex")}
        for tenant, client in clients.items():
            await asyncio.to_thread(ask_everything, client, "m", tenant)
            await asyncio.to_thread(ask_everything, client, "m-extra", f"{tenant}.extra")
            # Other engine kinds take no salt: the client's is dropped there too, not refused.
            answer = await asyncio.to_thread(
                clients[tenant].completions.create, model="sim", prompt="hi", max_tokens=2, extra_body=CLIENT_SALT
            )
            assert answer.choices[0].text is not None
        bodies = await asyncio.to_thread(standin.bodies)
    finally:
        await asyncio.to_thread(gw.stop)

    def tenant(body: dict[str, Any]) -> str:
        return str(body["_request_id"]).split("-")[0].split(".")[0]

    salts: dict[str, set[str | None]] = {"acme": set(), "globex": set()}
    generations = [b for b in bodies if tenant(b) in salts]  # not the deployments' warm-up
    for body in generations:
        salts[tenant(body)].add(body.get("cache_salt"))
    # 2 tenants x 2 aliases x 2 (with and without a client salt) x 4 calls, Responses as chat.
    assert len(generations) == 32
    assert {b["_path"] for b in generations} == {"/v1/chat/completions", "/v1/completions"}
    (acme,), (globex,) = salts["acme"], salts["globex"]  # one salt per tenant, on every request
    assert acme and globex and acme != globex
    assert not {acme, globex} & {CLIENT_SALT["cache_salt"], "from-the-deployment"}
    for salt in (acme, globex):  # what vLLM accepts as a salt: at most 128 characters, none of @ / \ NUL
        assert len(salt) <= 128 and not set(salt) & set("@/\\\x00")
