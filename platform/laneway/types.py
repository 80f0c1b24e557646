"""Cross-cutting value types that every layer may import (api, core, engines, db)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True, slots=True)
class ChatTurn:
    role: str
    content: str


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


@dataclass(frozen=True, slots=True)
class Delta:
    """One step of generated output: text may be empty (e.g. a held-back partial UTF-8 byte)."""

    text: str
    tokens: int = 1
    finish_reason: FinishReason | None = None
    # On the last delta, when the engine reports it: the prompt's exact token count (the
    # gateway may have estimated it); accounting uses it.
    prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class PromptMeasure:
    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Static facts about one deployment, used for routing, limits and metric labels."""

    engine: str
    model: str
    quantization: str = "unknown"
    gpu_type: str = "none"
    max_model_len: int = 2048
    max_concurrency: int = 1


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

    def may_use(self, alias: str) -> bool:
        return self.allowed_models is None or alias in self.allowed_models


@dataclass(slots=True)
class RequestTimings:
    started: float
    first_token: float | None = None
    finished: float | None = None
    queue_ms: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
