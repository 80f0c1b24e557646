"""Continuous batching for llama.cpp: one context holding `parallel` sequences, one thread
driving it with the low-level API.

Each step builds one llama_batch from every decoding sequence's next token plus chunks of
waiting prompts, shortest first (chunked prefill: a long prompt holds the others' decode up
for one chunk at most, never for its whole length, and a short prompt behind it is fed in
the next step, without the long one's chunk), runs one llama_decode, then samples each
sequence that has logits with its own sampler chain (logit biases, penalties, a grammar,
temperature / top_p / seed).

A step that is running cannot be interrupted, so a prompt that arrives while a long one
prefills waits for the chunk in flight. Each step's prompt tokens are therefore sized to a
time budget (`max_step_s`): the decoder keeps an EWMA of the seconds per token of its past
steps that carried prompt tokens and feeds as many prompt tokens as fit in the budget beside
the decoding sequences' tokens (those always go in), never fewer than MIN_STEP_PROMPT_TOKENS
(progress and throughput on slow hardware, where a step's fixed cost would otherwise
dominate) and never more than `n_batch` (fast hardware keeps full chunks). The budget holds
for every step, a lone prompt's too: the step in flight when a short prompt arrives was
sized before it came. Sequences join between steps; a cancelled one leaves before the
next step. A request's n choices run one after another in its sequence, keeping the prompt's
KV cells: only the prompt's last token is decoded again.

Prefix reuse (prefix_cache.py decides, on the event loop, where a sequence starts): a joining
sequence keeps its slot's cells up to the tokens its prompt shares with them (the slot's last
request's, of the same cache partition) and drops the rest (llama_memory_seq_rm), or gets a
warm-up system prompt's cells copied in from its reserved sequence (llama_memory_seq_cp; ids
after the user sequences'; a "reserve" sequence is prefill only and keeps its cells), then
prefills only the rest; at least its last prompt token is decoded, for the logits of its first
sample. Each sequence has its own stream of cells (llama.cpp's default, non-unified KV), so a
copy is of the whole stream's buffer, and dropping a user sequence's cells can never touch a
reserved one. A sequence that leaves, finished or cancelled, keeps its cells and says which
token ids they hold (BatchSequence.kept): its prompt's fed tokens and the generated tokens
decoded so far, all from steps that completed (a cancel is seen between steps only). A failed
step, or stopping, clears them instead.

The llama.cpp calls go through lowlevel.py (the fence around llama-cpp-python's private API);
ChoiceText (choice_text.py) turns each choice's tokens into deltas.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laneway.engines.llamacpp.choice_text import ChoiceText, token_logprob
from laneway.engines.llamacpp.lowlevel import BatchContext, Sampler
from laneway.engines.llamacpp.plan import DecodePlan
from laneway.types import GenerationRequest, TokenLogprob

log = logging.getLogger("laneway.engines.llamacpp")

PENALTY_LAST_N = 64  # tokens the presence/frequency penalties look back over (llama.cpp's default)
# The fewest prompt tokens a step carries under the time budget (when n_batch has room): where
# a token costs more than the budget allows, prefill still moves, at a cost: llama.cpp's CPU
# kernels are slower a token on small batches. 32 keeps the hold behind a step near a short
# prompt's own prefill on a small CPU; a larger floor would prefill faster but hold longer
# (bench/engines.py --min-step-tokens measures the trade).
MIN_STEP_PROMPT_TOKENS = 32
# A prompt of up to this many tokens, not yet cut, goes into one step whole even past the
# budget: cutting a 37-token chat into 32 + 5 would cost it a whole extra step of waiting.
WHOLE_PROMPT_TOKENS = 2 * MIN_STEP_PROMPT_TOKENS
COST_EWMA = 0.3  # weight of the latest step in the seconds-per-token estimate


def step_prompt_tokens(token_seconds: float | None, max_step_s: float, decoding: int, n_batch: int) -> int:
    """How many prompt tokens the next step may carry beside `decoding` decode tokens: as many
    as fit in `max_step_s` at `token_seconds` a token (the step's tokens, decode ones
    included), at least MIN_STEP_PROMPT_TOKENS and at most what n_batch leaves. No budget
    (max_step_s <= 0): what n_batch leaves. Nothing measured yet: the minimum, so the first
    step is short and measures the cost."""
    room = max(0, n_batch - decoding)
    if max_step_s <= 0:
        return room
    floor = min(MIN_STEP_PROMPT_TOKENS, room)
    if token_seconds is None or token_seconds <= 0:
        return floor
    return max(floor, min(room, int(max_step_s / token_seconds) - decoding))


@dataclass(eq=False)
class BatchSequence:
    """One request in the batch: its prompt's tokens and where decoding is."""

    seq_id: int
    req: GenerationRequest
    plan: DecodePlan
    prompt: list[int]
    emit: Callable[[Any], None]  # a Delta or an exception, to the request's queue
    on_exit: Callable[[], None]  # the decoder is done with the sequence (`kept` is set)
    cancel: threading.Event = field(default_factory=threading.Event)
    reuse: int = 0  # leading prompt tokens whose cells it starts from (prefix_cache.Start)
    copy_from: int | None = None  # the reserved sequence those cells are copied from, if any
    index: int = 0  # the choice being decoded
    fed: int = 0  # prompt tokens in the KV cells
    cut: bool = False  # its prompt was fed in parts (a whole short one is never split later)
    pos: int = 0  # the next token's position
    next_token: int | None = None  # sampled, to be decoded in the next step
    sampler: Sampler | None = None
    choice: ChoiceText | None = None
    reserve: bool = False  # prefill only, and its cells are kept as a shared prefix (warm-up)
    decoded: list[int] = field(default_factory=list)  # the choice's generated tokens in the cells
    kept: np.ndarray | None = None  # on exit: the token ids its cells hold (None: cleared)


class BatchDecoder:
    """The thread that owns one llama.cpp context of many sequences (see the module doc)."""

    def __init__(
        self, ctx: BatchContext, *, n_batch: int, eog: Callable[[int], bool], name: str, max_step_s: float = 0.0
    ) -> None:
        self.ctx, self.n_batch, self.n_vocab, self.eog = ctx, n_batch, ctx.n_vocab, eog
        self.max_step_s = max_step_s  # the time budget of a step's prompt tokens (<= 0: none, n_batch)
        self.token_seconds: float | None = None  # EWMA of a step's seconds per token (steps with prompt tokens)
        self.prompt_budget = n_batch  # the prompt-token budget of the latest step with prompt tokens (operators, tests)
        self._lock = threading.Condition()
        self._incoming: list[BatchSequence] = []
        self._running: list[BatchSequence] = []
        self._stopping = False
        self.steps = 0  # llama_decode calls (tests: sequences really share them)
        self.max_batched_sequences = 0  # the most sequences one step ever carried
        self.mixed_steps = 0  # steps that carried a prompt chunk beside other sequences' decode tokens
        self.prefix_hits = 0  # sequences that started from cached cells
        self.prefix_tokens_reused = 0  # prompt tokens they did not compute
        self.prompt_tokens_computed = 0  # prompt tokens sequences started without cached cells
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, seq: BatchSequence) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the decoder is stopped")
            self._incoming.append(seq)
            self._lock.notify()

    def wake(self) -> None:
        """A sequence was cancelled: let the thread see it without waiting for other work."""
        with self._lock:
            self._lock.notify()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join()

    # ---- the thread ----
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._incoming and not self._running:
                    self._lock.wait()
                if self._stopping:
                    leaving = self._running + self._incoming
                    self._running, self._incoming = [], []
                    break
                for seq in self._incoming:
                    if not seq.reserve:
                        self._start(seq)
                        self._begin_choice(seq, 0)
                self._running += self._incoming
                self._incoming = []
            try:
                self._step()
            except BaseException as exc:  # a failed step fails the sequences in it, not the thread
                log.exception("llama.cpp batch step failed")
                for seq in list(self._running):
                    seq.emit(exc)
                    self._retire(seq, keep=False)  # what its cells hold is not known
        for seq in leaving:
            self._retire(seq, keep=False)

    def _begin_choice(self, seq: BatchSequence, index: int) -> None:
        req, plan = seq.req, seq.plan
        seed = (req.seed + index if req.seed is not None else random.getrandbits(32)) & 0xFFFFFFFF
        biases = dict(zip(plan.bias_ids.tolist(), plan.bias_vals.tolist(), strict=True))
        seq.sampler = Sampler(
            self.ctx,
            biases=biases,
            penalty_last_n=PENALTY_LAST_N,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            grammar=plan.grammar,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=seed,
            top_k=plan.top_k,
            min_p=plan.min_p,
            repeat_penalty=plan.repeat_penalty,
        )
        seq.index = index
        seq.choice = ChoiceText(req, plan.mode, plan.tools, index, seq.emit)
        seq.next_token = None
        seq.decoded = []
        if index > 0:  # the prompt's cells stay; its last token is decoded again for fresh logits
            keep = max(0, len(seq.prompt) - 1)
            self.ctx.drop(seq.seq_id, keep)
            seq.fed = seq.pos = keep

    def _start(self, seq: BatchSequence) -> None:
        """Its slot's cells past the tokens it reuses go (after a warm-up prefix's are copied in:
        across streams llama.cpp copies only whole buffers)."""
        reuse = seq.reuse
        if seq.copy_from is not None:
            self.ctx.copy(seq.copy_from, seq.seq_id)
        if not self.ctx.drop(seq.seq_id, reuse):  # a model whose cells cannot be cut (recurrent)
            self.ctx.drop(seq.seq_id)
            reuse = 0
        seq.fed = seq.pos = reuse
        self.prompt_tokens_computed += len(seq.prompt) - reuse
        if reuse:
            self.prefix_hits += 1
            self.prefix_tokens_reused += reuse

    def _keep_prefix(self, seq: BatchSequence) -> None:
        """A reserve sequence is computed: its cells become a prefix for later sequences."""
        self._running.remove(seq)
        seq.kept = np.asarray(seq.prompt, dtype=np.int32)
        seq.on_exit()

    def _retire(self, seq: BatchSequence, *, keep: bool = True) -> None:
        """The sequence leaves between steps. A user sequence's cells stay (kept: the token ids
        they hold, for the next request in its slot); a reserve one's, or any when `keep` is
        False, are cleared."""
        if seq in self._running:
            self._running.remove(seq)
        if keep and not seq.reserve:
            seq.kept = np.asarray(seq.prompt[: seq.fed] + seq.decoded, dtype=np.int32)
        else:
            self.ctx.drop(seq.seq_id)
            seq.kept = None
        seq.sampler = None
        seq.on_exit()

    def _step(self) -> None:
        for seq in [s for s in self._running if s.cancel.is_set()]:
            self._retire(seq)
        if not self._running:
            return
        started = time.perf_counter()
        n = 0
        sampled: list[tuple[BatchSequence, int]] = []
        for seq in self._running:  # every decoding sequence's next token
            if seq.next_token is not None:
                self.ctx.add(n, seq.next_token, seq.pos, seq.seq_id, True)
                seq.decoded.append(seq.next_token)  # in the cells once this step completes
                sampled.append((seq, n))
                seq.pos += 1
                n += 1
        decoding = n
        # Then prompts, shortest remaining first, in what is left of the step: a short prompt
        # that arrives behind a long one is fed in the next step. A step that finishes a prompt
        # carries no longer prompt's partial chunk, so that prompt's first token waits for its
        # own tokens only (on a CPU a step's time grows with its tokens); the long one goes on
        # in the next step. The prompt tokens fit the step's time budget (step_prompt_tokens).
        waiting = sorted((s for s in self._running if s.fed < len(s.prompt)), key=lambda s: len(s.prompt) - s.fed)
        end = n
        if waiting:
            budget = step_prompt_tokens(self.token_seconds, self.max_step_s, decoding, self.n_batch)
            self.prompt_budget, end = budget, decoding + budget
        finishing = False
        for seq in waiting:
            left, room = len(seq.prompt) - seq.fed, end - n
            if not finishing and not seq.cut and left <= min(WHOLE_PROMPT_TOKENS, self.n_batch - n):
                room = max(room, left)  # a short prompt whole, in the step that starts it
            if room <= 0 or (finishing and left > room):
                break
            take = min(left, room)
            finishing = take == left
            seq.cut = seq.cut or not finishing
            for j in range(take):
                last = seq.fed + j == len(seq.prompt) - 1 and not seq.reserve
                self.ctx.add(n, seq.prompt[seq.fed + j], seq.fed + j, seq.seq_id, last)
                if last:
                    sampled.append((seq, n))
                n += 1
            seq.fed += take
            seq.pos = seq.fed
        if n == 0:
            return
        self.ctx.decode(n)
        self.steps += 1
        if 0 < decoding < n:
            self.mixed_steps += 1
        self.max_batched_sequences = max(self.max_batched_sequences, len({s.seq_id for s, _ in sampled}))
        for seq, i in sampled:
            self._sample(seq, i)
        if n > decoding:  # what a token cost, for the next steps' budgets (decode-only steps are
            # mostly fixed cost per step and say little about a prompt token's)
            cost = (time.perf_counter() - started) / n
            prev = self.token_seconds
            self.token_seconds = cost if prev is None else prev + COST_EWMA * (cost - prev)
        for seq in [s for s in self._running if s.reserve and s.fed == len(s.prompt)]:
            self._keep_prefix(seq)

    def _sample(self, seq: BatchSequence, i: int) -> None:
        choice = seq.choice
        assert choice is not None and seq.sampler is not None
        held = seq.plan.eog_ids if choice.produced < seq.plan.hold_eog else None
        tok = seq.sampler.sample(i, held)
        if self.eog(tok):
            choice.finish("stop")
            self._choice_over(seq)
            return
        logprobs: tuple[TokenLogprob, ...] = ()
        if seq.req.logprobs is not None:
            plan = seq.plan
            ptr = self.ctx.logits(i)
            logprobs = (
                token_logprob(ptr, self.n_vocab, tok, seq.req.logprobs, plan.bias_ids, plan.bias_vals, self._piece),
            )
        if choice.token(self._piece(tok), logprobs):
            self._choice_over(seq)
        else:
            seq.next_token = tok

    def _piece(self, tok: int) -> bytes:
        return self.ctx.piece(tok)

    def _choice_over(self, seq: BatchSequence) -> None:
        if seq.index + 1 < seq.req.n and not seq.cancel.is_set():
            self._begin_choice(seq, seq.index + 1)
        else:
            self._retire(seq)
