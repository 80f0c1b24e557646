"""The engine kinds a deployment may name: one descriptor per kind, registered once.

Everything that lists kinds reads this registry: building a deployment's engine
(`build_engine`), checking its config before it is written (`check_config`), the shared slots
of remote engines (engines/registry.py), the CLI's `--engine` choices, the admin UI's kind
choices and typed forms, and the extra `pip install laneway[...]` that a kind needs. A new kind
is one `register_engine_kind(EngineKind(...))` call (docs/architecture.md, Extension points)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from laneway.engines import extras
from laneway.engines.base import Engine, EngineError
from laneway.engines.config import DeploymentConfig, LlamaCppConfig, SimConfig, TritonConfig, VLLMConfig, parse_config
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.sim import SimEngine
from laneway.engines.trtllm import TritonTRTLLMEngine
from laneway.engines.vllm import VLLMEngine
from laneway.types import DeploymentSpec


class EngineFactory(Protocol):
    """Builds a kind's engine from a deployment row (an adapter's class is one)."""

    def __call__(
        self, alias: str, config: Mapping[str, Any], *, quantization: str, gpu_type: str, max_model_len: int | None
    ) -> Engine: ...


@dataclass(frozen=True)
class EngineKind:
    name: str  # what a deployment's engine_kind says
    config: type[DeploymentConfig]  # the struct its config is decoded into (engines/config.py)
    factory: EngineFactory
    # Outside this process, so other gateway replicas may front it too: its slots are shared
    # through Redis when there is one (the config's "shared_slots": false opts out).
    remote: bool = False
    # The optional dependency its engine needs (engines/extras.py): a deployment of the kind
    # fails to start with the line naming `pip install laneway[<extra>]` while it is missing.
    extra: extras.Extra | None = None
    # The config key that says where the engine runs (shown beside a start failure in the UI).
    location_key: str | None = None
    description: str = ""  # one line, shown with the kind's form in the admin UI


_KINDS: dict[str, EngineKind] = {}


def register_engine_kind(kind: EngineKind) -> EngineKind:
    """Make `kind` known to everything that lists kinds. A name is registered once: a second
    kind under a known name is refused rather than silently replacing the first."""
    if kind.name in _KINDS:
        raise ValueError(f"engine kind {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    return kind


def unregister_engine_kind(name: str) -> None:
    """Forget a kind (a test's, a plugin's being unloaded); deployments naming it then fail to start."""
    del _KINDS[name]


def engine_kinds() -> list[EngineKind]:
    """Every registered kind, by name."""
    return [_KINDS[name] for name in sorted(_KINDS)]


def engine_kind_names() -> list[str]:
    return sorted(_KINDS)


def find_engine_kind(name: str) -> EngineKind | None:
    return _KINDS.get(name)


def engine_kind(name: str) -> EngineKind:
    """The kind a deployment names; EngineError listing the known ones when it is not registered."""
    kind = _KINDS.get(name)
    if kind is None:
        raise EngineError(f"unknown engine kind {name!r} (known: {', '.join(sorted(_KINDS))})")
    return kind


def check_config(name: str, config: Mapping[str, Any]) -> None:
    """Raise EngineConfigError if a registered kind cannot take `config` (no engine is built)."""
    kind = _KINDS.get(name)
    if kind is not None:
        parse_config(kind.config, config)


def build_engine(spec: DeploymentSpec) -> Engine:
    kind = engine_kind(spec.engine_kind)
    if kind.extra is not None:  # say which extra, not ModuleNotFoundError from deep in start()
        extras.require(kind.extra)
    return kind.factory(
        spec.alias,
        spec.config,
        quantization=spec.quantization,
        gpu_type=spec.gpu_type,
        max_model_len=spec.max_model_len,
    )


for _builtin in (
    EngineKind(
        "llamacpp",
        LlamaCppConfig,
        LlamaCppEngine,
        extra=extras.LLAMACPP,
        location_key="model_path",
        description="A GGUF model run in this process by llama.cpp (llama-cpp-python), on CPU or GPU.",
    ),
    EngineKind(
        "sim",
        SimConfig,
        SimEngine,
        description="A simulated engine with a calibrated cost model, for tests and benchmarks (no model).",
    ),
    EngineKind(
        "vllm",
        VLLMConfig,
        VLLMEngine,
        remote=True,
        location_key="base_url",
        description="A vLLM server's OpenAI-compatible HTTP API.",
    ),
    EngineKind(
        "trtllm",
        TritonConfig,
        TritonTRTLLMEngine,
        remote=True,
        extra=extras.TRTLLM,
        location_key="url",
        description="TensorRT-LLM's ensemble behind a Triton Inference Server, over gRPC.",
    ),
):
    register_engine_kind(_builtin)
