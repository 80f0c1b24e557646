"""Bounded backpressure between the engine and the client, and early interruption.

A pump task pulls deltas from the pipeline into a buffer; the response drains it as fast as
the client's socket accepts bytes. Tokens in the buffer are *unacknowledged*: generated but
not yet handed to the transport. When a slow client lets them exceed the lane's
`max_unacked_tokens`, the generation is cancelled (the engine slot is freed for someone who
reads), and the stream ends with an error event. Without this bound an engine decodes for a
client that is not reading, and the gateway holds the whole answer in memory. (The time a
single send may stay blocked is bounded by the response, see api/leased_stream.py.)

The pump is also how a running request is cut short from outside (a shutdown past its
drain timeout): Lease.interrupt() puts the error in the buffer and cancels the pump, so
the client gets an error event, not a silently truncated stream.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncGenerator
from typing import Any, Protocol

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline.lease import Lease
from laneway.types import Delta

_END = object()
log = logging.getLogger("laneway.streaming")


class Runner(Protocol):
    """Whoever runs an admitted lease's generation (the Gateway)."""

    def run(self, lease: Lease) -> AsyncGenerator[Delta, None]: ...


def backpressure_error(limit: int) -> GatewayError:
    return GatewayError(
        ErrorCode.BACKPRESSURE,
        f"The client read the stream too slowly: more than {limit} tokens were waiting to be sent, "
        "so the generation was cancelled.",
    )


async def pumped(gateway: Runner, lease: Lease, limit: int | None) -> AsyncGenerator[list[Delta], None]:
    """The lease's deltas through a pump task, in batches: each batch is every delta that was
    waiting in the buffer when the consumer came for the next one (one, when the client keeps
    up with the engine; more, when an engine delivers several at once or the loop runs behind),
    so the response can send them in one write. `limit` bounds unacknowledged tokens (None: no
    bound). Raises GatewayError for an engine failure, a backpressure cut or an interruption,
    after the deltas that came before it."""
    # A deque and one waiter, not an asyncio.Queue: this runs once per token, and the queue's
    # get() and put_nowait() cost several times what the stream needs (one consumer, never full).
    buffer: collections.deque[Any] = collections.deque()
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] | None = None
    unacked = 0

    def put(item: Any) -> None:
        buffer.append(item)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def pump() -> None:
        nonlocal unacked
        source = gateway.run(lease)
        try:
            async for delta in source:
                unacked += max(1, delta.tokens)
                if limit is not None and unacked > limit:
                    lease.call.fail(ErrorCode.BACKPRESSURE)  # 499: the client did not read
                    put(backpressure_error(limit))
                    return  # closing the source (below) frees the engine slot now
                put(delta)
            put(_END)
        except GatewayError as exc:
            put(exc)
        except Exception:  # a bug, or an engine error no adapter mapped: without this the client would hang
            log.exception("stream %s failed", lease.call.request_id)
            put(
                GatewayError(ErrorCode.INTERNAL_ERROR, "The gateway failed to handle this request; it has been logged.")
            )
        finally:
            await source.aclose()

    task = asyncio.create_task(pump(), name=f"pump-{lease.call.request_id}")

    def interrupt(error: GatewayError) -> None:
        put(error)
        task.cancel()

    def stop() -> None:
        task.cancel()

    lease.interrupter = interrupt
    lease.stop_run = stop
    try:
        while True:
            while not buffer:
                waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    waiter = None
            item = buffer.popleft()
            batch: list[Delta] = []
            while True:
                if item is _END or isinstance(item, GatewayError):
                    break
                unacked -= max(1, item.tokens)
                batch.append(item)
                if not buffer:
                    item = None
                    break
                item = buffer.popleft()
            if batch:
                yield batch
            if item is _END:
                return
            if isinstance(item, GatewayError):
                raise item
    finally:
        lease.interrupter = None
        lease.stop_run = None
        task.cancel()
        # asyncio.wait, not `await task`: it never raises the pump's CancelledError, so a
        # cancellation of *this* task arriving meanwhile is not swallowed.
        await asyncio.wait({task})
