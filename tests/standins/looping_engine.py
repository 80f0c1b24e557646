"""A stand-in engine that answers with a fixed opening and then loops: one piece of text a
token, the `loop` pieces over and over until max_tokens (or `finish_after` pieces, where it
ends with "stop" as a model that is done). It counts the slots it holds and the generations
cancelled (closed) before their end, as a real adapter frees them.

The engine kind "looping" (LOOPING), registered by the tests that use it (support/engine_kinds.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, ClassVar, Unpack

import msgspec
from laneway.engines.adapter import DeploymentFacts, EngineAdapter
from laneway.engines.config import DeploymentConfig
from laneway.engines.kinds import EngineKind
from laneway.types import ChatTurn, Delta, GenerationRequest, PromptMeasure


class LoopingConfig(DeploymentConfig, kw_only=True):
    kind: ClassVar[str] = "looping"
    head: list[str] = []
    loop: list[str] = msgspec.field(default_factory=lambda: [" the"])
    finish_after: int | None = None


class LoopingEngine(EngineAdapter[LoopingConfig]):
    engine = "looping"
    config_type = LoopingConfig

    def __init__(self, alias: str, config: Mapping[str, Any] | LoopingConfig, **row: Unpack[DeploymentFacts]) -> None:
        super().__init__(alias, config, **row)
        self.head = list(self.config.head)
        self.loop = list(self.config.loop)
        self.finish_after = self.config.finish_after
        self.info = self.describe(
            context=self.max_model_len or 4096,
            slots=4,
            capabilities={"json_object", "json_schema", "n", "ignore_eos", "min_tokens"},
        )
        self.active = 0
        self.cancelled = 0
        self.decoded = 0  # tokens produced, all requests together

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def measure(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[ChatTurn] | None = None,
        tools: Sequence[dict[str, Any]] = (),
        response_format: dict[str, Any] | None = None,
    ) -> PromptMeasure:
        text = prompt if prompt is not None else " ".join(m.content for m in messages or ())
        return PromptMeasure(text=text, tokens=max(1, len(text.split())))

    def pieces(self, count: int) -> list[str]:
        """The first `count` pieces it emits for one choice."""
        out = self.head[:count]
        while len(out) < count:
            out.append(self.loop[(len(out) - len(self.head)) % len(self.loop)])
        return out

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta, None]:
        limit = request.max_tokens if self.finish_after is None else min(request.max_tokens, self.finish_after)
        ended = self.finish_after is not None and self.finish_after <= request.max_tokens
        self.active += 1
        done = False
        try:
            for index in range(request.n):
                pieces = self.pieces(limit)
                for k, piece in enumerate(pieces):
                    await asyncio.sleep(0)  # a decode step: other tasks run between tokens
                    self.decoded += 1
                    last = k == len(pieces) - 1
                    finish = ("stop" if ended else "length") if last else None
                    # The last delta ends it: the consumer may close it right after (no cancellation).
                    done = last and index == request.n - 1
                    yield Delta(text=piece, tokens=1, index=index, finish_reason=finish)  # type: ignore[arg-type]
        finally:
            self.active -= 1
            if not done:
                self.cancelled += 1

    async def warmup(self, prompts: Sequence[str]) -> None:
        pass

    async def health(self) -> bool:
        return True

    @property
    def active_slots(self) -> int:
        return self.active


LOOPING = EngineKind("looping", LoopingConfig, LoopingEngine, description="A stand-in that loops (tests).")
