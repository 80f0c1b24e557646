"""The Engine protocol every adapter implements.

Closing the iterator returned by generate() *is* cancellation: the adapter must free its
engine-side slot (stop decoding, abort the remote request) when that happens.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from laneway.types import ChatTurn, Delta, EmbeddingRequest, Embeddings, EngineInfo, GenerationRequest, PromptMeasure


class EngineError(Exception):
    """The engine failed to serve a request (crash, bad config, remote error)."""


class EngineRequestError(EngineError):
    """The request asks for what the engine cannot do with these values (a token id outside
    its vocabulary, a schema it cannot compile): the client's error (400), not the engine's."""


@runtime_checkable
class Engine(Protocol):
    info: EngineInfo

    async def start(self) -> None:
        """Load or connect; raise EngineError when the deployment cannot serve."""

    async def close(self) -> None: ...

    async def measure(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[ChatTurn] | None = None,
        tools: Sequence[dict[str, Any]] = (),
        response_format: dict[str, Any] | None = None,
    ) -> PromptMeasure:
        """Render chat messages (and the tools offered or the JSON form asked for, for an engine
        that renders them into the prompt) with the model's template and count prompt tokens."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta, None]:
        """Stream deltas; the last one carries finish_reason. aclose() on it cancels (frees the slot)."""
        ...

    async def warmup(self, prompts: Sequence[str]) -> None: ...

    async def health(self) -> bool: ...

    @property
    def active_slots(self) -> int:
        """Sequences holding an engine slot right now (for leak checks and metrics)."""
        ...


@runtime_checkable
class EmbeddingEngine(Engine, Protocol):
    """An engine that also implements embeddings; it declares "embeddings" in info.capabilities."""

    async def measure_inputs(self, inputs: Sequence[str]) -> list[int]:
        """Each input's token count, as embed() will count it (on the hot path: cheap, or off the loop)."""
        ...

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """One unit-length vector per input. Cancelling the await is cancellation: the adapter
        frees its engine-side slot (a worker thread stops between inputs; an HTTP request is
        closed, which vLLM takes as an abort)."""
        ...


@runtime_checkable
class PrefixReusingEngine(Protocol):
    """An engine that keeps computed KV cells (earlier requests', its deployment's warm-up
    system prompts') and starts later prompts from them (llama.cpp); it publishes what that
    saved, for /metrics."""

    @property
    def reuses_prefixes(self) -> bool:
        """Whether it keeps cells at all (False: nothing to report)."""
        ...

    @property
    def prefix_hits(self) -> int:
        """Requests that started from kept cells."""
        ...

    @property
    def prefix_tokens_reused(self) -> int:
        """Prompt tokens those requests did not compute."""
        ...

    @property
    def prompt_tokens_computed(self) -> int:
        """Prompt tokens requests started without kept cells for."""
        ...


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine reports of its own load (vLLM's /metrics): sequences running and waiting
    in the engine, whoever sent them, and the share of its KV cache in use (0..1)."""

    running: float
    waiting: float
    kv_usage: float


@runtime_checkable
class LoadReportingEngine(Protocol):
    """An engine that reports its load (a remote engine that other gateways may also feed)."""

    def reported_load(self) -> EngineLoad | None:
        """The last reading, or None before the first (or when it is too old to trust)."""
        ...


@runtime_checkable
class PrefixTrackingEngine(Protocol):
    """An engine whose prefix cache laneway follows exactly (vLLM with KV events)."""

    def cached_prefix_tokens(self, token_ids: Sequence[int], cache_salt: str | None) -> int | None:
        """Leading tokens of the prompt the engine holds cached, or None when not known."""
        ...


def unit_rows(vectors: NDArray[np.float32]) -> NDArray[np.float32]:
    """Each row scaled to unit length, as OpenAI's embeddings are (so a dot product is the
    cosine similarity); an all-zero row stays zero."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)


# isinstance against a runtime_checkable Protocol looks up each of its members on every call
# (about as much as the rest of a pick, and once per request in the latency model): the
# answer is kept per engine object (its methods do not come and go).
_LOAD_REPORTERS: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()
_PREFIX_TRACKERS: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()


def _capable(engine: object, known: weakref.WeakKeyDictionary[object, bool], check: Callable[[object], bool]) -> bool:
    try:
        capable = known.get(engine)
    except TypeError:  # an object without weak references (a test's stand-in): asked each time
        return check(engine)
    if capable is None:
        capable = known[engine] = check(engine)
    return capable


def load_reporter(engine: object) -> LoadReportingEngine | None:
    """The engine as a LoadReportingEngine, or None (the answer kept per engine object)."""
    if _capable(engine, _LOAD_REPORTERS, lambda e: isinstance(e, LoadReportingEngine)):
        return cast(LoadReportingEngine, engine)
    return None


def prefix_tracker(engine: object) -> PrefixTrackingEngine | None:
    """The engine as a PrefixTrackingEngine, or None (the answer kept per engine object)."""
    if _capable(engine, _PREFIX_TRACKERS, lambda e: isinstance(e, PrefixTrackingEngine)):
        return cast(PrefixTrackingEngine, engine)
    return None


def embedder(engine: Engine) -> EmbeddingEngine | None:
    """The engine as an EmbeddingEngine when it declares and implements embeddings."""
    if "embeddings" in engine.info.capabilities and isinstance(engine, EmbeddingEngine):
        return engine
    return None


def system_prompt_chat(system: str) -> list[ChatTurn]:
    """The chat a deployment's warm-up system prompt is warmed as (and, in llama.cpp, kept
    computed for prefix reuse)."""
    return [ChatTurn("system", system), ChatTurn("user", "Hello")]


async def run_warmup(engine: Engine, prompts: Sequence[str]) -> int:
    """Run each prompt through the engine for one token (the shared body of every adapter's
    warmup()); returns how many ran."""
    for i, prompt in enumerate(prompts):
        measured = await engine.measure(prompt=prompt)
        req = GenerationRequest(
            request_id=f"warmup-{i}", prompt=prompt, prompt_tokens=measured.tokens, max_tokens=1, seed=0
        )
        async for _ in engine.generate(req):
            pass
    return len(prompts)


async def run_embedding_warmup(engine: EmbeddingEngine, prompts: Sequence[str]) -> int:
    """warmup() of an embeddings-only deployment: embed each prompt once."""
    for i, prompt in enumerate(prompts):
        [tokens] = await engine.measure_inputs([prompt])
        await engine.embed(EmbeddingRequest(request_id=f"warmup-{i}", inputs=(prompt,), prompt_tokens=tokens))
    return len(prompts)
