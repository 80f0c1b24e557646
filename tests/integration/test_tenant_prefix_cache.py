"""Tenants never share cached prefixes in the in-process llama.cpp engine (issue 27): over the
HTTP gateway with the official SDK, a tenant's next turn starts from its own cached cells,
and another tenant sending the very same prompt reuses none of them."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
from support import start_gateway

PROMPT = "The shop opens at nine and closes at six; bicycles are repaired on Tuesdays. " * 3


def reused(gw: object) -> tuple[float, float]:
    """(prompt tokens reused from cached cells, prompt tokens computed) of the tiny deployment."""
    text = httpx.get(gw.base_url + "/metrics").text  # type: ignore[attr-defined]

    def read(name: str) -> float:
        found = re.search(rf'^{name}\{{deployment="tiny-llamacpp"\}} ([0-9.e+]+)$', text, re.M)
        return float(found.group(1)) if found else 0.0

    return read("laneway_engine_prefix_tokens_reused_total"), read("laneway_engine_prompt_tokens_computed_total")


def test_another_tenants_identical_prompt_reuses_nothing(tmp_path: Path, demo_model_path: Path) -> None:
    config = {"model_path": str(demo_model_path), "parallel": 2, "demo": True}
    models = {
        "tiny": [
            {
                "name": "tiny-llamacpp",
                "engine_kind": "llamacpp",
                "quantization": "f32",
                "gpu_type": "cpu",
                "max_model_len": 1024,
                "config": config,
            }
        ]
    }
    gw = start_gateway(tmp_path, seed_with={"models": models, "tenants": {"acme": {}, "beta": {}}})
    try:
        acme, beta = (openai.OpenAI(base_url=gw.api_url, api_key=gw.keys[t], max_retries=0) for t in ("acme", "beta"))
        acme.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
        before = reused(gw)
        acme.completions.create(model="tiny", prompt=PROMPT + "Is it open on Sunday?", max_tokens=2)
        after_acme = reused(gw)
        assert after_acme[0] - before[0] >= len(PROMPT) // 2  # acme's own history came from its cells
        beta.completions.create(model="tiny", prompt=PROMPT + "Is it open on Sunday?", max_tokens=2)
        after_beta = reused(gw)
        assert after_beta[0] == after_acme[0]  # not one of acme's cells
        assert after_beta[1] - after_acme[1] >= len(PROMPT) // 2  # beta computed the whole prompt
    finally:
        gw.stop()
