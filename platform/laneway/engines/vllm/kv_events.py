"""Following one vLLM server's KV events over ZeroMQ (vLLM started with --kv-events-config).

vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py) sends each batch as three frames:
topic, its sequence number (8 bytes, big-endian, from 0 at the server's start) and the
msgpack batch. Its PUB socket binds when its endpoint is a wildcard (`tcp://*:5557`) or
ipc://, and connects otherwise; this consumer does the opposite (`bind`). Its replay ROUTER
(replay_endpoint) answers a request [b"", start seq] with every batch it still buffers from
that one on, each [b"", topic, seq, batch], then [b"", b"", -1, b""].

The index (kv_index.py) is kept a subset of what vLLM holds, so it never claims a cached
prefix that is not there:
- a sequence gap is filled from the replay endpoint; what cannot be (no replay endpoint, the
  buffer has moved past it, no answer) may hide a BlockRemoved, so the index is forgotten
  and rebuilt from the events that follow;
- the first batch seen asks for the history before it (a gateway started after vLLM);
- a sequence number that goes back means vLLM restarted, with an empty cache.

pyzmq is imported only when a deployment enables this (the `vllm` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from laneway.engines import extras
from laneway.engines.base import EngineError
from laneway.engines.vllm.kv_index import KVBlockIndex

log = logging.getLogger("laneway.engines.vllm.kv_events")

END_SEQ = -1


def _import_zmq() -> Any:
    extras.require(extras.VLLM_KV_EVENTS)
    import zmq
    import zmq.asyncio

    return zmq


class KVEventsConsumer:
    """Subscribes to one vLLM's KV events and keeps its KVBlockIndex."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        bind: bool = False,
        replay_timeout_s: float = 2.0,
        name: str = "vllm",
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.bind = bind
        self.replay_timeout_s = replay_timeout_s
        self.name = name
        self.index = KVBlockIndex()
        self.seq: int | None = None  # the last batch applied
        self.gaps = 0  # sequence jumps seen
        self.replayed = 0  # batches recovered through the replay endpoint
        self.resets = 0  # times the index was forgotten: history lost, or vLLM restarted
        self._synced = False  # the index reflects the stream (not before its start, not mid-recovery)
        self._zmq: Any = None
        self._ctx: Any = None
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        zmq = self._zmq = _import_zmq()
        self._ctx = zmq.asyncio.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        try:
            (self._sub.bind if self.bind else self._sub.connect)(self.endpoint)
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise EngineError(f"vLLM KV events at {self.endpoint}: {exc}") from exc
        self._task = asyncio.create_task(self._run(), name=f"vllm-kv-events-{self.name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
        self._synced = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def synced(self) -> bool:
        """The index follows the stream: running, past its first batch, not filling a gap."""
        return self.running and self._synced

    def cached_prefix_tokens(self, token_ids: Sequence[int], cache_salt: str | None) -> int | None:
        """Leading tokens of the prompt vLLM holds in its prefix cache (whole blocks), or None
        when that is not known now (not synced, or vLLM hashes blocks another way)."""
        if not self.synced:
            return None
        return self.index.cached_prefix_tokens(token_ids, cache_salt)

    async def _run(self) -> None:
        try:
            if self.replay_endpoint is not None and await self._replay(0) == []:
                self._synced = True  # vLLM has published nothing yet: its cache is empty
            while True:
                frames = await self._sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    log.warning("%s: a KV event message of %d frames ignored", self.name, len(frames))
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if self.seq is not None and seq <= self.seq:  # vLLM restarted: its cache is empty
                    self._forget()
                    self.seq = None
                if self.seq is None:
                    await self._catch_up(0, seq)
                elif seq > self.seq + 1:
                    self.gaps += 1
                    await self._catch_up(self.seq + 1, seq)
                self._apply(seq, frames[2])
                self._synced = True
        except Exception:  # a bug, not the wire: the engine answers None from now on
            log.exception("%s: the KV events consumer stopped", self.name)

    async def _catch_up(self, start: int, until: int) -> None:
        """Apply batches start..until-1 from the replay buffer; forget the index when they
        cannot all be had (a missed BlockRemoved would leave a block claimed that is gone)."""
        if start >= until:
            return
        self._synced = False
        got = (await self._replay(start) if self.replay_endpoint is not None else None) or []
        got = [(s, p) for s, p in got if start <= s < until]
        if (not got or got[0][0] != start) and self.seq is not None:  # before the first batch: nothing to forget
            self._forget()
            log.warning("%s: KV events %d..%d could not be replayed; the index restarts", self.name, start, until - 1)
        for s, payload in got:
            self._apply(s, payload)
            self.replayed += 1

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """What the replay endpoint buffers from `start` on; None if it does not answer in time."""
        zmq = self._zmq
        dealer = self._ctx.socket(zmq.DEALER)  # one per request: a late answer to an old one is dropped with it
        dealer.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, bytes]] = []
        try:
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            async with asyncio.timeout(self.replay_timeout_s):
                while True:
                    frames = await dealer.recv_multipart()
                    if len(frames) != 4 or len(frames[2]) != 8:
                        continue
                    seq = int.from_bytes(frames[2], "big", signed=True)
                    if seq == END_SEQ:
                        return out
                    out.append((seq, frames[3]))
        except (TimeoutError, zmq.ZMQError) as exc:
            log.warning("%s: KV events replay at %s did not answer (%r)", self.name, self.replay_endpoint, exc)
            return None
        finally:
            dealer.close(linger=0)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            self.index.apply(payload)
        except msgspec.DecodeError as exc:  # a batch not understood may have removed blocks
            log.warning("%s: KV event batch %d not understood (%s); the index restarts", self.name, seq, exc)
            self._forget()
        self.seq = seq

    def _forget(self) -> None:
        self.index.forget()
        self.resets += 1
