"""A sim replica's deployment row for the unit tests that build an EngineRegistry by hand."""

from __future__ import annotations

from laneway.types import DeploymentSpec


def sim_replica(i: int, *, max_model_len: int = 8192, draining: bool = False, **config: object) -> DeploymentSpec:
    """Replica `m-{i}` of alias "m" on the sim engine, with `config` as its engine config."""
    return DeploymentSpec(
        id=i,
        name=f"m-{i}",
        alias="m",
        engine_kind="sim",
        quantization="q8",
        gpu_type="sim",
        max_model_len=max_model_len,
        config=dict(config),
        draining=draining,
    )


def llamacpp_replica(
    i: int, model_path: object, *, max_model_len: int, quantization: str, **config: object
) -> DeploymentSpec:
    """Replica m-<i> of alias "m" on llama.cpp in-process, serving the GGUF at `model_path`."""
    return DeploymentSpec(
        id=i,
        name=f"m-{i}",
        alias="m",
        engine_kind="llamacpp",
        quantization=quantization,
        gpu_type="none",
        max_model_len=max_model_len,
        config={"model_path": str(model_path), **config},
    )
