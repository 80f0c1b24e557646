"""Fault injection into an in-process engine: its streams fail mid-answer, as a replica that
dies (the continuation tests of llama.cpp, issue 39)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from laneway.engines.base import EngineError
from laneway.types import Delta, GenerationRequest


def dying_after(engine: Any, deltas: int) -> list[str]:
    """From now on the engine's streams fail after `deltas` deltas (`healed` undoes it); the
    texts it sent before failing, as it sends them."""
    real = type(engine).generate.__get__(engine)
    sent: list[str] = []

    async def generate(req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        stream = real(req)
        try:
            n = 0
            async for d in stream:
                sent.append(d.text)
                yield d
                n += 1
                if n == deltas:
                    raise EngineError("the replica died mid-stream")
        finally:
            await stream.aclose()

    engine.generate = generate
    return sent


def healed(engine: Any) -> None:
    """The engine's own generate again."""
    engine.__dict__.pop("generate", None)
