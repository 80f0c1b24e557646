"""Engines whose client libraries are optional extras of the distribution: the base install
serves vLLM over HTTP; `laneway[llamacpp]` adds llama.cpp in-process (llama-cpp-python, which
compiles for minutes, and gguf for the demo model), `laneway[trtllm]` adds Triton's gRPC
client, `laneway[vllm]` pyzmq for vLLM's KV events. Modules import these lazily, so laneway
imports without them, and a deployment that needs one that is missing says so in one line
instead of a ModuleNotFoundError."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from laneway.engines.base import EngineError


@dataclass(frozen=True)
class Extra:
    name: str  # pip install laneway[<name>]
    needs: str  # who needs it, as the message starts
    modules: tuple[str, ...]  # what must import


LLAMACPP = Extra("llamacpp", "llama.cpp deployments need", ("llama_cpp",))
GGUF = Extra("llamacpp", "writing the demo model needs", ("gguf",))
DEMO_MODEL = Extra("llamacpp", "the demo model (llama.cpp) needs", ("gguf", "llama_cpp"))
TRTLLM = Extra("trtllm", "TensorRT-LLM (Triton) deployments need", ("tritonclient.grpc",))
VLLM_KV_EVENTS = Extra("vllm", "vLLM KV events (kv_events_endpoint) need", ("zmq.asyncio",))


class MissingExtra(EngineError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, extra: Extra, missing: str) -> None:
        super().__init__(f"{extra.needs} `pip install laneway[{extra.name}]` ({missing} is not installed)")
        self.extra = extra


def missing_extra(extra: Extra) -> MissingExtra | None:
    """The error to raise when `extra` is not installed, else None. Only a module that is
    absent counts (or one disabled with sys.modules[name] = None): one that is installed but
    fails to load (a broken shared library) raises its own error where it is used, not a
    misleading "pip install"."""
    for module in extra.modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:  # exc.name: grpc, say, when tritonclient lacks [grpc]
            return MissingExtra(extra, (exc.name or module).partition(".")[0])
        except Exception:
            return None
    return None


def require(extra: Extra) -> None:
    error = missing_extra(extra)
    if error is not None:
        raise error
