"""The pump hands the response every delta that is ready at once, so they go out in one
write: an engine that delivers 16 tokens in one read costs one send, not 16. A client that
keeps up with the engine still gets each delta as it comes, and an error still comes after
the deltas before it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline.stream import pumped
from laneway.types import Delta


class Engine:
    def __init__(self, deltas: list[Delta], *, pause: bool = False, fail: GatewayError | None = None) -> None:
        self.deltas, self.pause, self.fail = deltas, pause, fail

    async def run(self, lease: Any) -> AsyncGenerator[Delta, None]:
        for d in self.deltas:
            if self.pause:
                await asyncio.sleep(0.001)  # one token at a time, as a decoding engine
            yield d
        if self.fail is not None:
            raise self.fail


def lease() -> Any:
    return SimpleNamespace(call=SimpleNamespace(request_id="r", fail=lambda *a: None), interrupter=None)


async def batches(engine: Engine) -> list[list[str]]:
    return [[d.text for d in batch] async for batch in pumped(engine, lease(), limit=1000)]  # type: ignore[arg-type]


async def test_deltas_ready_together_come_as_one_batch() -> None:
    deltas = [Delta(f"t{i}") for i in range(16)] + [Delta("", finish_reason="length")]
    assert await batches(Engine(deltas)) == [[d.text for d in deltas]]


async def test_deltas_that_come_one_by_one_are_passed_on_one_by_one() -> None:
    deltas = [Delta(f"t{i}") for i in range(5)]
    assert await batches(Engine(deltas, pause=True)) == [[f"t{i}"] for i in range(5)]


async def test_an_error_comes_after_the_deltas_before_it() -> None:
    seen: list[list[str]] = []
    with pytest.raises(GatewayError):
        engine = Engine([Delta("a"), Delta("b")], fail=GatewayError(ErrorCode.ENGINE_ERROR, "boom"))
        async for batch in pumped(engine, lease(), 1000):  # type: ignore[arg-type]
            seen.append([d.text for d in batch])
    assert seen == [["a", "b"]]


async def test_an_unexpected_failure_ends_the_stream_with_a_500_not_a_hang() -> None:
    """An exception that is no GatewayError (a bug, an engine error no adapter mapped) once left
    the pump task dead and the response waiting on its buffer forever."""

    class Broken(Engine):
        async def run(self, lease: Any) -> AsyncGenerator[Delta, None]:
            yield Delta("a")
            raise RuntimeError("not mapped")

    seen: list[list[str]] = []
    with pytest.raises(GatewayError) as raised:
        async with asyncio.timeout(5):
            async for batch in pumped(Broken([]), lease(), 1000):  # type: ignore[arg-type]
                seen.append([d.text for d in batch])
    assert seen == [["a"]] and (raised.value.status, raised.value.code) == (500, "internal_error")
