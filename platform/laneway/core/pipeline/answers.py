"""What the pipeline's entry hands back, and what it asks of its caller while a request waits."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from laneway.core.pipeline.call import Call
from laneway.core.pipeline.lease import Lease
from laneway.core.pipeline.stream import Runner, pumped
from laneway.types import Delta, Embeddings

T = TypeVar("T")


class Client(Protocol):
    """The caller's side of a request while it waits: the API binds the call to its HTTP
    request and races the wait against the client hanging up."""

    def bound(self, call: Call) -> None: ...
    async def watch(self, work: Awaitable[T], call: Call) -> T: ...


@dataclass(frozen=True, slots=True)
class Completed:
    call: Call
    deltas: list[Delta]


@dataclass(frozen=True, slots=True)
class Embedded:
    call: Call
    result: Embeddings


class Streaming:
    """An admitted stream. Whoever receives it owns the lease and must release it.

    Nothing of it is sent before start() has the first batch: a replica that fails before its
    first token is failed over inside the pipeline, or the request ends with an error status,
    never with a 200 stream that carries no token."""

    def __init__(self, lease: Lease, runner: Runner) -> None:
        self.lease = lease
        self._batches = pumped(runner, lease, limit=max(1, lease.call.lane.max_unacked_tokens))
        self._first: list[Delta] = []

    @property
    def call(self) -> Call:
        return self.lease.call

    async def start(self) -> None:
        """Wait for the first batch (raises what ended the generation before it)."""
        try:
            self._first = await anext(self._batches)
        except StopAsyncIteration:
            self._first = []

    async def batches(self) -> AsyncGenerator[list[Delta], None]:
        """The deltas in batches, unacknowledged tokens bounded by the lane (core/pipeline/stream.py)."""
        try:
            if self._first:
                yield self._first
            async for batch in self._batches:
                yield batch
        finally:
            await self._batches.aclose()
