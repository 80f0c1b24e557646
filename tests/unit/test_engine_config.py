"""The typed config of each engine kind (engines/config.py): defaults as before, numbers given
as strings taken, and a refusal that names the key."""

from __future__ import annotations

from typing import Any

import pytest
from laneway.engines.config import (
    EngineConfigError,
    LlamaCppConfig,
    SimConfig,
    VLLMConfig,
    parse_config,
)
from laneway.engines.kinds import check_config, engine_kinds
from laneway.engines.sim import SimEngine
from laneway.engines.trtllm import TritonTRTLLMEngine
from laneway.engines.vllm import VLLMEngine


def test_every_registered_kind_refuses_a_config_in_its_own_name() -> None:
    # A refusal starts with the struct's `kind`: the name the deployment gave.
    assert [(k.name, k.config.kind) for k in engine_kinds()] == [(k.name, k.name) for k in engine_kinds()]


@pytest.mark.parametrize(
    ("kind", "config", "said", "key"),
    [
        ("vllm", {"model": "m"}, "vllm needs config key 'base_url'", "base_url"),
        ("vllm", {"decode_ms_base": 1}, "vllm needs config key 'base_url'", "base_url"),  # missing comes first
        ("sim", {"paralel": 2}, "sim config: unknown key 'paralel' (known: ", "paralel"),
        (
            "sim",
            {"max_concurrency": "many"},
            "sim config: max_concurrency: expected `int`, got `str` ('many')",
            "max_concurrency",
        ),
        (
            "llamacpp",
            {"model_path": "m.gguf", "pooling": "none"},
            "llamacpp config: pooling must be one of mean, cls, last, not 'none'",
            "pooling",
        ),
        (
            "vllm",
            {"base_url": "http://x", "tokenize": "sometimes"},
            "vllm config: tokenize must be one of auto, always, never, true, false, not 'sometimes'",
            "tokenize",
        ),
        ("trtllm", {"url": "x:1", "lanes": "interactive"}, "trtllm config: lanes: expected `array | null`", "lanes"),
    ],
)
def test_a_refusal_names_the_key(kind: str, config: dict[str, Any], said: str, key: str) -> None:
    with pytest.raises(EngineConfigError) as refused:
        check_config(kind, config)
    assert str(refused.value).startswith(said) and refused.value.key == key


def test_numbers_as_strings_are_taken_and_bools_for_tokenize() -> None:
    c = parse_config(LlamaCppConfig, {"model_path": "m.gguf", "parallel": "3", "logit_bias": {"5": "1.5"}})
    assert c.parallel == 3 and c.logit_bias == {5: 1.5}
    assert VLLMEngine("m", {"base_url": "http://x/", "tokenize": False}).tokenize == "never"
    assert VLLMEngine("m", {"base_url": "http://x/", "tokenize": True}).tokenize == "always"


def test_the_defaults_are_the_engines_old_ones() -> None:
    sim = SimEngine("m", {})
    assert (
        sim.prefill_ms_per_token,
        sim.decode_ms_base,
        sim.decode_ms_per_seq,
        sim.max_concurrency,
        sim.fault_after_tokens,
        sim.info.max_model_len,
    ) == (0.02, 2.0, 0.1, 8, 2, 8192)
    vllm = VLLMEngine("alias", {"base_url": "http://x/"})
    assert (
        vllm.base_url,
        vllm.model,
        vllm.tokenize,
        vllm.max_waiting,
        vllm.max_kv_usage,
        vllm.timeout_s,
        vllm.info.max_concurrency,
        vllm.info.max_model_len,
    ) == ("http://x", "alias", "auto", 32, 0.98, 600, 64, 4096)
    trt = TritonTRTLLMEngine("m", {"url": "x:1"})
    assert (trt.model, trt.top_k, trt.ssl, trt.probe_timeout_s, trt.info.max_concurrency) == (
        "ensemble",
        0,
        False,
        2.0,
        64,
    )
    assert parse_config(SimConfig, {"lanes": ["a"], "warmup_system_prompts": ["x"], "stop": ["###"]}).lanes == ["a"]
    assert parse_config(VLLMConfig, {"base_url": "http://x", "shared_slots": False}).shared_slots is False
