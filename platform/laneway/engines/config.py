"""A typed config per engine kind: what a deployment row's `config` may say, with defaults.

A deployment's config is stored as JSON (the admin API, the CLI, the UI write it) and decoded
here when its engine is built. An unknown key is refused rather than ignored (a misspelt
`paralel` would otherwise leave the default in force without a word), and a refusal names
the key: it reaches the admin API, the UI and the CLI as the reason the deployment cannot
start. Numbers given as strings are taken, as int()/float() took them before. Which kind
decodes its config into which struct: engines/kinds.py.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

from laneway.engines.base import EngineError


class EngineConfigError(EngineError):
    """A deployment's config that its engine kind cannot take; `key` is the key at fault."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class DeploymentConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Keys every kind takes, read by the gateway rather than the engine."""

    kind: ClassVar[str] = "engine"
    # The lanes this deployment is dedicated to (none: it serves every lane); engines/registry.py.
    lanes: list[str] | None = None
    # Chats warmed at start-up (and, in batched llama.cpp, kept computed for prefix reuse).
    warmup_system_prompts: list[str] = []
    # The model's default stop sequences, merged with the task's and the request's.
    stop: list[str] = []
    # No first token within this many seconds counts as the replica failing: the request goes
    # to another replica of the alias (core/pipeline/failover.py). None: wait as long as it takes.
    first_token_timeout_s: float | None = None


class RemoteEngineConfig(DeploymentConfig, kw_only=True):
    """Keys of an engine outside this process, which other gateway replicas may front too."""

    # Its slots are shared through Redis when there is one; false opts out.
    shared_slots: bool = True
    max_concurrency: int = 64
    max_model_len: int = 4096


class SimConfig(DeploymentConfig, kw_only=True):
    kind: ClassVar[str] = "sim"
    prefill_ms_per_token: float = 0.02
    decode_ms_base: float = 2.0
    decode_ms_per_seq: float = 0.1
    max_concurrency: int = 8
    fault_marker: str = "<<laneway-sim-fault>>"
    fault_after_tokens: int = 2
    warmup_ms: float = 0.0
    max_model_len: int = 8192
    embeddings: bool = False
    embedding_dim: int = 64
    embed_ms: float = 0.0


class VLLMConfig(RemoteEngineConfig, kw_only=True):
    kind: ClassVar[str] = "vllm"
    base_url: str
    model: str | None = None  # the served model's name; None: the alias
    api_key: str | None = None
    ca_file: str | None = None  # the CA of an https base_url's certificate, when private
    # "auto": estimate, and ask /tokenize only near the context; true: "always"; false: "never".
    tokenize: Literal["auto", "always", "never"] | bool = "auto"
    max_waiting: float = 32
    max_kv_cache_usage: float = 0.98
    metrics_poll_s: float = 1.0
    timeout_s: float = 600
    extra_body: dict[str, Any] = {}
    embeddings: bool = False
    tool_calling: bool = False  # vLLM runs with --enable-auto-tool-choice and a parser
    # The precise prefix index (engines/vllm/kv_events.py): vLLM run with --enable-prefix-caching
    # and --kv-events-config (publisher "zmq"). None: off. The endpoint as laneway reaches it;
    # `kv_events_bind` when vLLM's endpoint is not a wildcard (vLLM connects, laneway binds).
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_bind: bool = False


class TritonConfig(RemoteEngineConfig, kw_only=True):
    kind: ClassVar[str] = "trtllm"
    url: str  # host:port of Triton's gRPC endpoint
    model: str = "ensemble"
    end_id: int | None = None
    pad_id: int | None = None
    top_k: int = 0
    bad_words: list[str] = []
    ssl: bool = False
    probe_timeout_s: float = 2.0


class LlamaCppConfig(DeploymentConfig, kw_only=True):
    kind: ClassVar[str] = "llamacpp"
    model_path: str
    parallel: int = 2
    n_ctx: int | None = None  # None: the deployment's max_model_len, else 2048
    n_threads: int | None = None  # None: every core when batching, else cores / parallel
    n_gpu_layers: int = 0  # layers offloaded in a CUDA/Metal build (-1: all)
    demo: bool = False  # ban the demo model's invalid-UTF-8 byte tokens
    ban_tokens: list[int] = []
    logit_bias: dict[int, float] = {}
    embedding: bool = False  # serve embeddings only
    pooling: Literal["mean", "cls", "last"] | None = None  # with embedding; None: the model's own
    batching: bool = True  # one context of `parallel` sequences decoded together
    n_batch: int = 512  # tokens a batched step carries at most
    max_step_ms: float = 100.0  # batched: the time a step's prompt tokens are sized to (0: n_batch)


ConfigT = TypeVar("ConfigT", bound=DeploymentConfig)


def parse_config(cls: type[ConfigT], config: Mapping[str, Any] | ConfigT) -> ConfigT:
    """`config` as `cls`; EngineConfigError naming the key when it cannot be."""
    if not isinstance(config, Mapping):
        return config
    for field in msgspec.structs.fields(cls):  # a missing key first: before any other key's fault
        if field.required and field.encode_name not in config:
            raise EngineConfigError(f"{cls.kind} needs config key '{field.encode_name}'", field.encode_name)
    try:
        return msgspec.convert(config, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise _explained(cls, config, str(exc)) from None


def _explained(cls: type[DeploymentConfig], config: Any, said: str) -> EngineConfigError:
    kind = cls.kind
    missing = re.fullmatch(r"Object missing required field `(\w+)`", said)
    if missing:
        return EngineConfigError(f"{kind} needs config key '{missing[1]}'", missing[1])
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", said)
    if unknown:
        known = ", ".join(sorted(cls.__struct_fields__))
        return EngineConfigError(f"{kind} config: unknown key '{unknown[1]}' (known: {known})", unknown[1])
    at = re.search(r"`\$\.(\w+)", said)
    if at is None or not isinstance(config, Mapping):
        return EngineConfigError(f"{kind} config: {said}")
    key, value = at[1], config.get(at[1])
    choices = _choices(cls, key)
    if said.startswith("Invalid enum value") and choices:
        return EngineConfigError(f"{kind} config: {key} must be one of {', '.join(choices)}, not {value!r}", key)
    what = said.split(" - at ")[0]
    return EngineConfigError(f"{kind} config: {key}: {what[0].lower()}{what[1:]} ({value!r})", key)


def _choices(cls: type[DeploymentConfig], key: str) -> list[str]:
    """The strings a Literal-typed key takes (for a refusal that lists them)."""
    hint = typing.get_type_hints(cls).get(key)
    out: list[str] = []
    for part in typing.get_args(hint) or (hint,):
        if typing.get_origin(part) is Literal:
            out += [str(x) for x in typing.get_args(part)]
        elif part is bool:
            out += ["true", "false"]
    return out
