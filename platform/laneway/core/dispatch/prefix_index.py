"""The approximate prefix index: which prompt prefixes this gateway sent to which replica.

A prompt is cut into fixed-size blocks of its rendered text and each block is hashed with
everything before it (a chain), so two prompts share a block hash exactly when they share
the whole prefix up to that block's end. The chain starts from the tenant's cache salt: one
tenant's prompts never match another's, as the engines' caches are partitioned the same way.

Each replica keeps an LRU of the block hashes sent to it, sized like the engine's KV cache:
what the engine has most likely evicted, the index has too. A prompt's blocks are recorded
tail first, so a prefix's first blocks are the freshest and a long prompt's tail is what an
overflowing index drops, as an engine's cache drops its leaves first.

Each gateway replica keeps its own index (no Redis round trip on the hot path); replicas that
have not seen a prefix agree where it goes through the rendezvous hash of its anchor (see
picker.py), so they route a conversation alike without sharing this.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

MAX_BLOCKS = 1024  # of a single prompt: the hashing cost is bounded whatever its length


def prompt_blocks(text: str, salt: str | None, block_bytes: int) -> list[bytes]:
    """The chained hashes of the prompt's whole blocks (a trailing partial block is not
    something an engine caches either)."""
    data = text.encode("utf-8", "surrogatepass")
    h = hashlib.blake2b((salt or "").encode(), digest_size=8).digest()
    out = []
    end = min(len(data) - block_bytes, (MAX_BLOCKS - 1) * block_bytes)
    for start in range(0, end + 1, block_bytes):
        h = hashlib.blake2b(h + data[start : start + block_bytes], digest_size=8).digest()
        out.append(h)
    return out


def anchor(text: str, salt: str | None, key: str | None, blocks: list[bytes], block_bytes: int) -> bytes:
    """What places a prompt nobody has seen: its session key when it has one, else its first
    block (for most chats: the system prompt), else the whole short prompt."""
    if key is not None:
        return hashlib.blake2b(f"{salt or ''}\0key\0{key}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    if blocks:
        return blocks[0]
    head = text.encode("utf-8", "surrogatepass")[:block_bytes]
    return hashlib.blake2b((salt or "").encode() + b"\0" + head, digest_size=8).digest()


@dataclass(frozen=True, slots=True)
class Route:
    """What dispatch knows of a request when it places it."""

    blocks: list[bytes]
    anchor: bytes
    session_key: str | None  # the tenant's salt and prompt_cache_key, when it sent one
    block_tokens: float  # estimated prompt tokens per block
    # The prompt's token ids as the engine counts them, when measuring produced them: an engine
    # whose cache laneway follows exactly (vLLM's KV events) is asked about these instead.
    token_ids: tuple[int, ...] | None = None
    salt: str | None = None


class PrefixIndex:
    def __init__(self, max_sessions: int = 100_000) -> None:
        self._blocks: dict[str, OrderedDict[bytes, None]] = {}
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._max_sessions = max_sessions

    def cached(self, replica: str, blocks: list[bytes]) -> int:
        """How many of the prompt's leading blocks the replica most likely holds."""
        held = self._blocks.get(replica)
        if not held:
            return 0
        n = 0
        for h in blocks:
            if h not in held:
                break
            n += 1
        return n

    def record(self, replica: str, blocks: list[bytes], capacity: int) -> None:
        held = self._blocks.setdefault(replica, OrderedDict())
        for h in reversed(blocks):  # tail first: the prefix's head ends freshest
            held[h] = None
            held.move_to_end(h)
        while len(held) > max(capacity, 1):
            held.popitem(last=False)

    def session(self, key: str) -> str | None:
        return self._sessions.get(key)

    def remember_session(self, key: str, replica: str) -> None:
        self._sessions[key] = replica
        self._sessions.move_to_end(key)
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)

    def forget(self, replica: str) -> None:
        """A replica left (removed, or restarted with a cold cache)."""
        self._blocks.pop(replica, None)

    def size(self, replica: str) -> int:
        return len(self._blocks.get(replica, ()))
