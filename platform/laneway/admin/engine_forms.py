"""The typed form of each engine kind, generated from the config struct its descriptor names
(engines/kinds.py; the structs: engines/config.py): one input per field, its widget from the
field's type (a checkbox for a bool, a select for a Literal, a number, a line per list
item...), its default as the placeholder. A field added to a struct appears here by itself; its label, unit and line of
help come from CONFIG_HELP (tests/unit/test_engine_forms.py keeps every field described).

Read back, a form becomes the config dict put_model takes: blank inputs are left out (the
engine's default applies), and the engine's own parse_config checks and converts it, so a
refusal names the field in the engine's words."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from laneway.admin.presentation import FieldHelp
from laneway.engines.config import DeploymentConfig, parse_config
from laneway.engines.kinds import engine_kind, engine_kind_names

# Config keys the deployment's own fields set (its Context wins over the engine's max_model_len).
SHADOWED = frozenset({"max_model_len"})
SECRETS = frozenset({"api_key"})  # never shown back in a form
# What a field's None default means, for its placeholder.
NONE_MEANS = {
    "model": "the alias",
    "n_ctx": "the context",
    "n_threads": "auto",
    "first_token_timeout_s": "no limit",
    "api_key": "none (a swap keeps it)",
    "ca_file": "the system's",
    "end_id": "Triton's",
    "pad_id": "Triton's",
}
PREFIX = "config."  # the form's input names: config.base_url, ...

_H = tuple[str, str, str]  # label, unit, help
CONFIG_HELP: dict[str, _H] = {
    # every kind (read by the gateway)
    "lanes": (
        "Dedicated to lanes",
        "",
        "Serve only the ticked lanes' requests; they try dedicated replicas first. None ticked: every lane.",
    ),
    "warmup_system_prompts": (
        "Warm-up system prompts",
        "one per line",
        "Run at start (1 token each) so their prefix is cached before the first request.",
    ),
    "stop": (
        "Default stop sequences",
        "one per line",
        "The model's own stops, merged with the task's and the request's.",
    ),
    "first_token_timeout_s": (
        "First-token timeout",
        "seconds",
        "No first token within this long counts as the "
        "replica failing: the request moves to another replica. Blank = wait.",
    ),
    "shared_slots": (
        "Share slots through Redis",
        "",
        "Gateway replicas fronting this engine share its slots (when Redis is configured).",
    ),
    "max_concurrency": (
        "Max concurrency",
        "sequences at once",
        "Requests laneway runs on it at once (vLLM's --max-num-seqs); the rest wait in laneway's lanes.",
    ),
    # vllm
    "base_url": ("Base URL", "", "The vLLM server's root, e.g. http://vllm-1:8000 (https: TLS)."),
    "model": (
        "Served model name",
        "",
        "The engine's name for the model (vLLM's --served-model-name, Triton's model). Blank = the default shown.",
    ),
    "api_key": ("API key", "", "Sent as a bearer token (vLLM's --api-key). Blank = none."),
    "ca_file": ("TLS CA file", "path", "The CA of an https base URL's certificate, when it is private."),
    "tokenize": ("Exact token counts", "", "auto: estimate, and ask /tokenize only near the context; always; never."),
    "max_waiting": (
        "Overloaded past",
        "requests waiting",
        "More than this waiting in vLLM's own queue: routed around until it drains.",
    ),
    "max_kv_cache_usage": ("Overloaded past KV-cache use", "fraction 0-1", "Above this KV-cache use: routed around."),
    "metrics_poll_s": ("Metrics poll", "seconds", "How often its /metrics is read (the load routing sees); 0: never."),
    "timeout_s": ("Request timeout", "seconds", "The longest one request to the engine may take."),
    "extra_body": (
        "Extra request fields",
        "name = JSON value, one per line",
        "Added to every request body sent to the engine.",
    ),
    "embeddings": ("Serves embeddings", "", "The model answers POST /v1/embeddings."),
    "tool_calling": ("Tool calling", "", "vLLM runs with --enable-auto-tool-choice and a tool parser."),
    "kv_events_endpoint": (
        "KV events endpoint",
        "zmq address",
        "Where vLLM publishes its KV-cache events "
        "(--kv-events-config), e.g. tcp://vllm-1:5557: routing then knows exactly what it "
        "caches. Blank = off.",
    ),
    "kv_events_replay_endpoint": (
        "KV events replay endpoint",
        "zmq address",
        "vLLM's replay socket, to fill a gap in the events. Blank = a gap resets what laneway knows.",
    ),
    "kv_events_topic": ("KV events topic", "", "The topic vLLM publishes under (blank: all)."),
    "kv_events_bind": (
        "Bind for KV events",
        "",
        "vLLM connects to this gateway (its endpoint is a plain "
        "tcp://host:port) instead of this gateway connecting to vLLM.",
    ),
    # trtllm
    "url": ("gRPC address", "host:port", "Triton's gRPC endpoint."),
    "end_id": ("End token id", "", "The model's end-of-sequence token. Blank = Triton's default."),
    "pad_id": ("Pad token id", "", "Blank = Triton's default."),
    "top_k": ("Top-k", "tokens", "Sampling's top-k (0: off)."),
    "bad_words": ("Banned words", "one per line", "Never generated."),
    "ssl": ("TLS", "", "Connect to Triton over TLS."),
    "probe_timeout_s": ("Health probe timeout", "seconds", "Each readiness check, at start and in health checks."),
    # sim
    "prefill_ms_per_token": ("Prefill time", "ms per prompt token", "The simulated engine's cost model."),
    "decode_ms_base": ("Decode step", "ms", "A decode step's time with one sequence."),
    "decode_ms_per_seq": ("Decode step per sequence", "ms", "Added per sequence decoded together."),
    "fault_marker": ("Fault marker", "", "A prompt holding this text fails mid-stream (tests)."),
    "fault_after_tokens": ("Fault after", "tokens", "When a marked prompt fails."),
    "warmup_ms": ("Warm-up time", "ms", "How long its start takes."),
    "embedding_dim": ("Embedding size", "dimensions", "Of the simulated embeddings."),
    "embed_ms": ("Embedding time", "ms", "Per embeddings request."),
    # llamacpp
    "model_path": ("Model file", "path", "The GGUF file, on this gateway's host."),
    "parallel": ("Parallel sequences", "sequences", "Decoded together in one context."),
    "n_ctx": ("Context cells", "tokens", "Blank = the deployment's context."),
    "n_threads": ("Threads", "", "Blank = every core when batching, else cores / parallel."),
    "n_gpu_layers": ("GPU layers", "layers", "Offloaded in a CUDA/Metal build (-1: all)."),
    "demo": ("Demo model", "", "Ban the demo model's invalid-UTF-8 byte tokens."),
    "ban_tokens": ("Banned token ids", "comma separated", "Never generated."),
    "logit_bias": ("Logit bias", "token id = bias, one per line", "Added to those tokens' logits."),
    "embedding": ("Embeddings only", "", "Serve embeddings, not text."),
    "pooling": ("Pooling", "", "With embeddings; blank = the model's own."),
    "batching": ("Batch sequences", "", "One context of all parallel sequences, decoded together."),
    "n_batch": ("Batch size", "tokens", "The most tokens one batched step carries."),
    "max_step_ms": ("Step time", "ms", "What a batched step's prompt tokens are sized to (0: the batch size)."),
}
ADVANCED = frozenset(
    {
        "warmup_system_prompts",
        "stop",
        "first_token_timeout_s",
        "shared_slots",
        "ca_file",
        "tokenize",
        "max_waiting",
        "max_kv_cache_usage",
        "timeout_s",
        "extra_body",
        "end_id",
        "pad_id",
        "top_k",
        "bad_words",
        "probe_timeout_s",
        "fault_marker",
        "fault_after_tokens",
        "n_threads",
        "ban_tokens",
        "logit_bias",
        "pooling",
        "n_batch",
        "max_step_ms",
        "demo",
    }
)


@dataclass(frozen=True)
class ConfigField:
    help: FieldHelp
    name: str  # the input's name (config.<key>)
    required: bool
    advanced: bool
    default: Any


def _widget(hint: Any) -> tuple[str, tuple[tuple[str, str], ...], str]:
    """(kind, choices, step) of a config field's type."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _widget(args[0])
    literals = [
        str(v)
        for a in ([hint] if origin is Literal else args)
        if typing.get_origin(a) is Literal
        for v in typing.get_args(a)
    ]
    if literals:
        return "select", tuple((v, v) for v in literals), ""
    if hint is bool:
        return "checkbox", (), ""
    if hint is int:
        return "number", (), "1"
    if hint is float:
        return "number", (), "any"
    if origin is list:
        return ("text" if args == [int] else "lines"), (), ""
    if origin is dict:
        return "lines", (), ""
    return "text", (), ""


def config_fields(kind: str, lanes: list[str] | None = None) -> list[ConfigField]:
    """The form's fields for `kind`, in the struct's order (required ones first); the
    "lanes" field becomes a checkbox per lane (`lanes`: the lanes there are)."""
    cls = engine_kind(kind).config
    hints = typing.get_type_hints(cls)
    out = []
    for f in msgspec.structs.fields(cls):
        if f.name in SHADOWED:
            continue
        label, unit, words = CONFIG_HELP.get(f.name, (f.name.replace("_", " ").capitalize(), "", ""))
        widget, choices, step = _widget(hints[f.name])
        default = None if f.required else (f.default_factory() if f.default is msgspec.NODEFAULT else f.default)
        if f.name == "lanes":
            widget, choices = "checks", tuple((lane, lane) for lane in lanes or ())
        if widget == "select" and (default is None or f.name == "tokenize"):
            choices = (("", f"default ({default})" if default is not None else "default"), *choices)
        if f.name in SECRETS:
            widget = "secret"
        placeholder = "required" if f.required else NONE_MEANS.get(f.name, "") if default is None else _shown(default)
        helped = FieldHelp(
            f.name,
            label,
            unit,
            words,
            "",
            step=step or "1",
            min="",
            max="",
            placeholder=placeholder,
            kind=widget,
            choices=choices,
        )
        out.append(ConfigField(helped, PREFIX + f.name, f.required, f.name in ADVANCED, default))
    return sorted(out, key=lambda c: not c.required)


def _shown(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def form_values(kind: str, config: dict[str, Any]) -> dict[str, str]:
    """A stored config as the form's inputs show it (secrets left out)."""
    out = {}
    for f in config_fields(kind):
        key = f.help.name
        if key not in config or key in SECRETS:
            continue
        value = config[key]
        if f.help.kind == "lines" and isinstance(value, dict):
            out[f.name] = "\n".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
        elif f.help.kind == "lines" and isinstance(value, list):
            out[f.name] = "\n".join(str(v) for v in value)
        elif isinstance(value, list):
            out[f.name] = ", ".join(str(v) for v in value)
        else:
            out[f.name] = _shown(value)
    return out


def read_config(kind: str, form: dict[str, str], checked: dict[str, list[str]]) -> dict[str, Any]:
    """The config the form says, checked and converted by the engine's own parse_config
    (EngineConfigError naming the key otherwise). Blank inputs are left out: the engine's
    default applies. `checked`: the ticked values of each checkbox group (the lanes)."""
    raw: dict[str, Any] = {}
    for f in config_fields(kind):
        key, kind_of = f.help.name, f.help.kind
        if kind_of == "checkbox":
            ticked = form.get(f.name) == "true"
            if ticked != f.default:
                raw[key] = ticked
            continue
        if kind_of == "checks":
            if checked.get(f.name):
                raw[key] = checked[f.name]
            continue
        text = form.get(f.name, "").strip()
        if text == "":
            continue
        if kind_of == "lines":
            lines = [line for line in form[f.name].splitlines() if line.strip()]
            raw[key] = _pairs(lines) if isinstance(f.default, dict) else lines
        elif kind_of == "text" and isinstance(f.default, list):
            raw[key] = [x.strip() for x in text.split(",") if x.strip()]
        else:
            raw[key] = text
    typed = parse_config(engine_kind(kind).config, raw)
    return {key: msgspec.to_builtins(getattr(typed, key)) for key in raw}


def _pairs(lines: list[str]) -> dict[str, Any]:
    """`name = JSON value` lines (a value that is not JSON is taken as text)."""
    out: dict[str, Any] = {}
    for line in lines:
        name, _, value = line.partition("=")
        try:
            out[name.strip()] = json.loads(value)
        except ValueError:
            out[name.strip()] = value.strip()
    return out


def kinds() -> list[str]:
    return engine_kind_names()


def kind_description(kind: str) -> str:
    """The kind's one line, shown with its form."""
    return engine_kind(kind).description


def described(cls: type[DeploymentConfig]) -> list[str]:
    """The fields of `cls` the form has no words for (a test keeps this empty)."""
    return [f.name for f in msgspec.structs.fields(cls) if f.name not in CONFIG_HELP and f.name not in SHADOWED]
