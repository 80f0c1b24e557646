"""The llama.cpp engine's prefix cache: which slot a request takes, and which of the KV cells
already there (or in a warm-up system prompt's reserved sequence) it starts from.

A slot (a sequence of the batch context, or a context of its own with `batching: false`) keeps
the cells of the last request it served when that request ends, finished or cancelled: its
prompt's and its generated tokens' that were computed. This index, kept on the event loop,
remembers for each idle slot the token ids those cells hold, the request's cache partition
(GenerationRequest.cache_salt) and when the slot was last given back. A new request takes:

- the idle slot of its own partition whose cells share the most leading tokens with its
  prompt, reused in place (the cells past the shared tokens are dropped), unless a warm-up
  prefix shares more;
- else the least recently used idle slot (one that never held anything first), starting
  from the warm-up prefix that shares the most (its cells copied in), or from nothing.

The prompt's last token is never counted as shared (it is decoded, for the logits of the first
sample), and fewer than MIN_PREFIX_REUSE shared tokens are computed, not reused. One
partition's cells are never reused by another (None matches only None); the warm-up prefixes
are shared by every partition, as the deployment declares them. Limits: one cached
conversation per idle slot (a slot another request takes keeps only what they share), and a
running request's cells are nobody else's to start from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Fewer shared tokens than this are computed, not reused: every chat shares its first few
# (BOS and the template's opening marker) with every other, which is no reason to take a slot
# holding another conversation, nor to copy a warm-up prefix's whole stream (n_ctx cells).
MIN_PREFIX_REUSE = 16
NOTHING = np.zeros(0, dtype=np.int32)


def shared_tokens(prefix: np.ndarray, prompt: np.ndarray) -> int:
    """How many leading token ids the two have in common."""
    n = min(len(prefix), len(prompt))
    differ = np.flatnonzero(prefix[:n] != prompt[:n])
    return int(differ[0]) if len(differ) else n


@dataclass(frozen=True, eq=False)
class Prefix:
    """A warmed prompt prefix: its cells stay in a reserved sequence for the context's life."""

    seq_id: int
    tokens: np.ndarray  # the token ids in those cells


@dataclass(frozen=True)
class Start:
    """Where a request begins: its slot, and how many of its prompt's leading tokens are in the
    slot's cells once the cells past them are dropped (after copying `copy_from`'s in, if set)."""

    slot: int
    reuse: int = 0
    copy_from: int | None = None  # a reserved sequence (a warm-up prefix)


@dataclass(frozen=True)
class Kept:
    """What an idle slot's cells hold: token ids from position 0, the partition they belong to,
    and the order of the slot's last use (0: never used)."""

    tokens: np.ndarray
    salt: str | None
    used: int


class SlotCache:
    """The index of what each slot's cells hold (see the module doc); the event loop's alone."""

    def __init__(self, slots: int) -> None:
        self._kept = [Kept(NOTHING, None, 0) for _ in range(slots)]
        self._idle = set(range(slots))
        self._clock = 0
        self.prefixes: list[Prefix] = []  # the warm-up system prompts' reserved sequences

    def kept(self, slot: int) -> Kept:
        return self._kept[slot]

    def take(self, prompt: Sequence[int], salt: str | None) -> Start:
        """Pick an idle slot for `prompt` (a caller holds one of the pool's tickets, so one is
        idle) and mark it taken."""
        head = np.asarray(prompt, dtype=np.int32)[:-1]  # the last token is always decoded
        by_age = sorted(self._idle, key=self._age)
        own, own_shared = None, 0
        for slot in by_age:  # on a tie, the least recently used goes: the fresher stays
            kept = self._kept[slot]
            if kept.salt == salt and len(kept.tokens):
                n = shared_tokens(kept.tokens, head)
                if n > own_shared:
                    own, own_shared = slot, n
        copy_from, copied = None, 0
        for prefix in self.prefixes:
            n = shared_tokens(prefix.tokens, head)
            if n > copied:
                copy_from, copied = prefix.seq_id, n
        if own is not None and own_shared >= max(copied, MIN_PREFIX_REUSE):
            start = Start(own, own_shared)
        elif copied >= MIN_PREFIX_REUSE:
            start = Start(by_age[0], copied, copy_from)
        else:
            start = Start(by_age[0])
        self._idle.remove(start.slot)
        return start

    def give_back(self, slot: int, tokens: np.ndarray | None, salt: str | None) -> None:
        """The slot is idle again, its cells holding `tokens` (None: nothing)."""
        self._clock += 1
        held = NOTHING if tokens is None else tokens
        self._kept[slot] = Kept(held, salt, self._clock if len(held) else 0)
        self._idle.add(slot)

    def _age(self, slot: int) -> tuple[bool, int]:
        kept = self._kept[slot]
        return len(kept.tokens) > 0, kept.used
