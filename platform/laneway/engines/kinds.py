"""The engine kinds a deployment may name, and how one is built from its row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from laneway.engines.base import Engine, EngineError
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.sim import SimEngine
from laneway.engines.trtllm import TritonTRTLLMEngine
from laneway.engines.vllm import VLLMEngine
from laneway.types import DeploymentSpec

EngineFactory = Callable[..., Any]
ENGINE_KINDS: dict[str, EngineFactory] = {
    "llamacpp": LlamaCppEngine,
    "sim": SimEngine,
    "vllm": VLLMEngine,
    "trtllm": TritonTRTLLMEngine,
}

REMOTE_ENGINE_KINDS = frozenset({"vllm", "trtllm"})


def build_engine(spec: DeploymentSpec) -> Engine:
    factory = ENGINE_KINDS.get(spec.engine_kind)
    if factory is None:
        raise EngineError(f"unknown engine kind {spec.engine_kind!r} (known: {', '.join(sorted(ENGINE_KINDS))})")
    engine: Engine = factory(
        spec.alias,
        spec.config,
        quantization=spec.quantization,
        gpu_type=spec.gpu_type,
        max_model_len=spec.max_model_len,
    )
    return engine
