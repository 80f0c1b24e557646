"""Bounded backpressure between the engine and a streaming client.

A pump task pulls deltas from the pipeline into a buffer; the HTTP body drains it as fast
as the client's socket accepts bytes. Tokens in the buffer are *unacknowledged*: generated
but not yet handed to the transport. When a slow client lets them exceed the lane's
`max_unacked_tokens`, the generation is cancelled (the engine slot is freed for someone who
reads), and the stream ends with an error event. Without this bound an engine decodes for a
client that is not reading, and the gateway holds the whole answer in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from laneway.core.errors import GatewayError
from laneway.core.pipeline import Call, Gateway
from laneway.types import Delta

_END = object()


def backpressure_error(call: Call, limit: int) -> GatewayError:
    return GatewayError(
        503,
        f"The client read the stream too slowly: more than {limit} tokens were waiting to be sent, "
        "so the generation was cancelled.",
        code="backpressure",
        type="service_unavailable",
    )


async def bounded_stream(gateway: Gateway, call: Call) -> AsyncGenerator[Delta, None]:
    limit = max(1, call.lane.max_unacked_tokens)
    buffer: asyncio.Queue[Any] = asyncio.Queue()
    unacked = 0

    async def pump() -> None:
        nonlocal unacked
        source = gateway.run(call)
        try:
            async for delta in source:
                unacked += max(1, delta.tokens)
                if unacked > limit:
                    call.status, call.error_code = 499, "backpressure"
                    await source.aclose()  # frees the engine slot now; finish() records why
                    buffer.put_nowait(backpressure_error(call, limit))
                    return
                buffer.put_nowait(delta)
            buffer.put_nowait(_END)
        except GatewayError as exc:
            buffer.put_nowait(exc)

    task = asyncio.create_task(pump(), name=f"pump-{call.request_id}")
    try:
        while True:
            item = await buffer.get()
            if item is _END:
                return
            if isinstance(item, GatewayError):
                raise item
            unacked -= max(1, item.tokens)
            yield item
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
