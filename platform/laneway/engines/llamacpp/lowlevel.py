"""The fence around llama-cpp-python's private low-level wrappers.

Continuous batching needs what the public `Llama` class does not offer: one llama_context of
many sequences, a llama_batch filled token by token, per-sequence sampler chains, and the KV
cells of one sequence removed or copied into another. llama-cpp-python has these as
`llama_cpp._internals` (LlamaContext, LlamaBatch, LlamaSampler) on the model a `Llama` holds
as `_model`. This module is the only one in laneway that imports `_internals` or reads a
private attribute of llama_cpp; the rest of the package sees BatchContext and Sampler.

The private API changes between patch releases (LlamaSampler.add_penalties took n_vocab
again in 0.3.35), so pyproject.toml pins llama-cpp-python to the tested release and
tests/unit/test_llamacpp_internals.py fails when anything touched here changes its
signature or shape (docs/decisions/0003-llama-cpp-internals.md).
"""

from __future__ import annotations

from typing import Any


class Sampler:
    """One choice's sampler chain: logit biases, penalties, a grammar, then greedy or
    top_k / top_p / min_p / temperature / a seeded draw, as llama.cpp's common sampling orders them."""

    def __init__(
        self,
        ctx: BatchContext,
        *,
        biases: dict[int, float],
        penalty_last_n: int,
        frequency_penalty: float,
        presence_penalty: float,
        grammar: Any,
        temperature: float,
        top_p: float,
        seed: int,
        top_k: int = 0,
        min_p: float = 0.0,
        repeat_penalty: float = 1.0,
    ) -> None:
        from llama_cpp._internals import LlamaSampler

        self._ctx: Any = ctx._ctx
        chain: Any = LlamaSampler()  # type: ignore[no-untyped-call]
        if biases:
            chain.add_logit_bias(ctx.n_vocab, biases)
        if presence_penalty or frequency_penalty or repeat_penalty != 1.0:
            chain.add_penalties(ctx.n_vocab, penalty_last_n, repeat_penalty, frequency_penalty, presence_penalty)
        if grammar is not None:
            chain.add_grammar(ctx._model, grammar)
        if temperature <= 0:
            chain.add_greedy()
        else:
            if top_k > 0:
                chain.add_top_k(top_k)
            chain.add_top_p(top_p, 1)
            if min_p > 0:
                chain.add_min_p(min_p, 1)
            chain.add_temp(temperature)
            chain.add_dist(seed)
        self._chain = chain

    def sample(self, i: int, masked: Any = None) -> int:
        """The token drawn from the logits of the batch's `i`-th token (accepted into the chain);
        the token ids in `masked` (an int array) are never drawn."""
        if masked is not None:
            logits = self._ctx.get_logits_ith(i)
            for tok in masked.tolist():
                logits[tok] = -float("inf")
        return int(self._chain.sample(self._ctx, i))


class BatchContext:
    """A llama_context of `sequences` sequences on a loaded `Llama`'s model, `n_ctx` cells
    each (every sequence its own stream), and the one llama_batch each step is built in."""

    def __init__(self, llama: Any, *, sequences: int, n_ctx: int, n_batch: int, n_threads: int) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaBatch, LlamaContext

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * sequences
        params.n_seq_max = sequences
        params.n_batch = params.n_ubatch = n_batch
        params.n_threads = params.n_threads_batch = n_threads
        self._model: Any = llama._model
        self.n_vocab = int(llama.n_vocab())
        self._ctx: Any = LlamaContext(model=self._model, params=params, verbose=False)
        self._batch: Any = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self._tokens: Any = self._batch.batch

    def add(self, n: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
        """Put `token` at `pos` of sequence `seq_id` in the batch's slot `n` (with logits: sampled after)."""
        b = self._tokens
        b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = token, pos, 1, logits
        b.seq_id[n][0] = seq_id

    def decode(self, n_tokens: int) -> None:
        """Run the batch's first `n_tokens` tokens through the model (RuntimeError on failure)."""
        self._tokens.n_tokens = n_tokens
        self._ctx.decode(self._batch)

    def logits(self, i: int) -> Any:
        """A pointer to the batch's `i`-th token's logits (n_vocab floats)."""
        return self._ctx.get_logits_ith(i)

    def piece(self, token: int) -> bytes:
        """A token's text, as bytes (special tokens give none)."""
        return bytes(self._model.detokenize([token], special=False))

    def drop(self, seq_id: int, start: int = -1) -> bool:
        """Clear sequence `seq_id`'s cells from position `start` on (-1 or 0: all of them);
        False when the memory cannot drop part of a sequence (a recurrent model's)."""
        return bool(self._ctx.kv_cache_seq_rm(seq_id, start, -1))

    def copy(self, src: int, dst: int) -> None:
        """Copy every cell of sequence `src` into sequence `dst`."""
        self._ctx.kv_cache_seq_cp(src, dst, -1, -1)

    def last_position(self, seq_id: int) -> int:
        """The position of sequence `seq_id`'s last cell (-1: it has none)."""
        import llama_cpp

        return int(llama_cpp.llama_memory_seq_pos_max(self._ctx.memory, seq_id))

    @property
    def sequences(self) -> int:
        import llama_cpp

        return int(llama_cpp.llama_n_seq_max(self._ctx.ctx))

    def close(self) -> None:
        self._batch.close()
        self._ctx.close()
