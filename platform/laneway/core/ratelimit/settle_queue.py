"""The settles a Redis-backed limiter owes Redis: sent off the response path, riding with
the next batch of reserves (the hub's linger), and kept and retried while Redis does not
answer, so a tenant's concurrency holders and refunds are never lost to an outage."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from functools import partial

from redis.exceptions import RedisError

from laneway.core.ratelimit.scripts import SETTLE
from laneway.core.redis_hub import RedisHub

log = logging.getLogger("laneway.core.ratelimit")

SETTLE_LINGER_S = 0.005  # how long a settle waits for a batch of reserves to ride with

Call = tuple[list[str], list[int | str]]


class SettleQueue:
    def __init__(
        self,
        hub: RedisHub,
        retry_after_s: float,
        trip: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub = hub
        self._retry_after = retry_after_s
        self._trip = trip  # the limiter's breaker: a failed settle is a Redis fault
        self._clock = clock
        self._failed: deque[Call] = deque(maxlen=100_000)  # retried until Redis answers
        self.outstanding = 0  # handed to the hub, not answered yet
        self._retrier: asyncio.Task[None] | None = None
        self.closing = False

    @property
    def pending(self) -> int:
        """Settles not yet answered by Redis: in flight, or kept after a fault."""
        return self.outstanding + len(self._failed)

    def send(self, keys: list[str], args: list[int | str]) -> None:
        """With the next batch of reserves, or alone after SETTLE_LINGER_S: under load a
        settle rides in a write that goes out anyway, and a concurrency slot or a refund comes
        back a few milliseconds later. One that fails is kept and retried."""
        self.outstanding += 1
        linger = 0.0 if self.closing else SETTLE_LINGER_S
        reply = self.hub.call(SETTLE, keys, args, linger=linger)
        reply.add_done_callback(partial(self._sent, keys, args))

    def _sent(self, keys: list[str], args: list[int | str], reply: asyncio.Future[object]) -> None:
        self.outstanding -= 1
        exc = asyncio.CancelledError() if reply.cancelled() else reply.exception()
        if exc is None:
            return
        if not isinstance(exc, RedisError | OSError | asyncio.CancelledError):
            log.error("a rate-limit settle failed and is dropped: %r", exc)
            return
        self._trip(exc)
        self._failed.append((keys, args))
        if self._retrier is None or self._retrier.done():
            self._retrier = asyncio.get_running_loop().create_task(self._retry(), name="redis-settles")

    async def _retry(self) -> None:
        """Retry the settles that failed, in batches of up to 256, backing off while Redis
        does not answer."""
        backoff = self._retry_after
        while self._failed:
            if not self.closing:
                await asyncio.sleep(backoff)
            batch = [self._failed.popleft() for _ in range(min(256, len(self._failed)))]
            replies = [self.hub.call(SETTLE, keys, args) for keys, args in batch]
            failed, fault = [], None
            for call, reply in zip(batch, replies, strict=True):
                try:
                    await reply
                except (RedisError, OSError) as exc:
                    failed.append(call)
                    fault = exc
            if fault is None:
                backoff = self._retry_after
                continue
            self._trip(fault)
            self._failed.extendleft(reversed(failed))  # first in line again
            if self.closing:
                return  # close() gave up waiting; what is left expires in Redis
            backoff = min(backoff * 2, 30.0)

    async def settled(self, timeout_s: float, extra: Callable[[], int] = lambda: 0) -> bool:
        """Wait until every queued settle (and `extra`'s count) has been sent; False on timeout."""
        deadline = self._clock() + timeout_s
        while self.pending + extra():
            if self._clock() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def drain(self, timeout_s: float) -> None:
        """Send what is still queued, for up to timeout_s (shutdown)."""
        self.closing = True
        self.hub.flush_soon()
        try:
            async with asyncio.timeout(timeout_s):
                while self.outstanding or (self._retrier is not None and not self._retrier.done()):
                    if self._retrier is not None and not self._retrier.done():
                        await asyncio.shield(self._retrier)
                    else:
                        await asyncio.sleep(0.002)
        except TimeoutError:
            if self._retrier is not None:
                self._retrier.cancel()
