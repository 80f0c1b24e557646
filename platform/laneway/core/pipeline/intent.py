"""What a client asked for, once the API layer has translated its wire format: the one
argument of the pipeline's entry. The API decodes and checks the body's shape; everything
that needs the model, the tenant or the policies is decided by the pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from laneway.types import ChatTurn, SamplingExtensions


@dataclass(frozen=True, kw_only=True, slots=True)
class Addressed:
    """Who a request is for and how to route it (headers or metadata, beyond the model): what
    every intent carries."""

    task: str | None = None
    lane: str | None = None  # asked for explicitly (X-Laneway-Lane): only where the tenant may
    priority: int = 0
    # X-Laneway-TTFT-Target-Ms, checked by the API (a positive finite number of ms); the
    # pipeline clamps it to the tenant's grant (core/slo.py).
    ttft_target_ms: float | None = None
    user: str | None = None  # the request's `user`: the end user behind the tenant
    client_request_id: str | None = None  # the client's X-Request-Id, when sane
    background: bool = False  # a batch line: runs in the background lane, whatever `lane` says


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerationIntent(Addressed):
    """Chat, completions and Responses: one prompt (or conversation) to generate from."""

    endpoint: str  # "chat", "completions" or "responses": the usage row's endpoint
    alias: str
    stream: bool
    # OpenAI's prompt_cache_key (checked by the API): keeps a conversation on the replica that
    # holds its prefix while load allows (core/dispatch/).
    prompt_cache_key: str | None = None
    prompt: str | None = None  # completions
    messages: Sequence[ChatTurn] | None = None  # chat and Responses
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    n: int = 1
    tools: Sequence[dict[str, Any]] = ()
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    extensions: SamplingExtensions | None = None  # engine-specific sampling (top_k, min_tokens...)


@dataclass(frozen=True, kw_only=True, slots=True)
class EmbeddingIntent(Addressed):
    alias: str
    inputs: Sequence[str]


Intent = GenerationIntent | EmbeddingIntent
