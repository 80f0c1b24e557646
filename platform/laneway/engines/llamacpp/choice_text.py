"""One choice's generated tokens -> deltas, and a token's log probability: shared by the
one-context-per-slot and the batched decoding."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any

import numpy as np

from laneway.engines.call_envelope import EnvelopeReader, cut_calls
from laneway.engines.tool_calls import parse_calls
from laneway.types import Delta, FinishReason, GenerationRequest, TokenLogprob, ToolCall, TopLogprob


class ChoiceText:
    """One choice's tokens -> deltas: UTF-8 held across tokens, the token cap, the stops (this
    choice ends at one; the gateway cuts the text itself), and an answer held back to be read
    as tool calls (mode "tools"; "auto": once it starts like JSON).

    A held answer is read as the call envelope while it comes: the choice ends as soon as the
    envelope is whole (or its first call is, without parallel calls), and an answer cut short
    ends with the calls as far as they got. The envelope itself is never sent as text; in
    auto mode JSON that is not an envelope for these tools is the model's text."""

    def __init__(
        self, req: GenerationRequest, mode: str, tools: list[dict[str, Any]], index: int, emit: Callable[[Any], None]
    ) -> None:
        self.req, self.tools, self.index, self.emit = req, tools, index, emit
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.holding = mode == "tools"
        self.deciding = mode == "auto"  # whitespace before the first character waits to decide
        self.held: list[str] = []
        self.envelope = EnvelopeReader.of(tools)
        self.required = mode == "tools"
        self.window = max((len(x) for x in req.stop), default=0)
        self.tail = ""
        self.produced = 0
        # Stop strings wait for min_tokens, as vLLM's stop checks do.
        self.min_tokens = (req.extensions.min_tokens or 0) if req.extensions is not None else 0
        self.done = False

    def token(self, raw: bytes, logprobs: tuple[TokenLogprob, ...] = ()) -> bool:
        """Take one generated token's bytes; True when the choice is over (its last delta sent)."""
        self.produced += 1
        text = self.decoder.decode(raw)
        if self.deciding and text.strip():
            self.deciding, self.holding = False, text.lstrip().startswith(("{", "["))
            if not self.holding:  # plain text after all: what waited goes out with it
                text, self.held = "".join(self.held) + text, []
        capped = self.produced >= self.req.max_tokens
        if self.holding or self.deciding:
            self.held.append(text)
            if self.holding and self._envelope_whole(text):
                return True
        elif capped:
            end = text + self.decoder.decode(b"", final=True)
            self.emit(Delta(text=end, tokens=1, finish_reason="length", index=self.index, logprobs=logprobs))
            self.done = True
            return True
        else:
            self.emit(Delta(text=text, tokens=1, index=self.index, logprobs=logprobs))
            if self.req.stop and self.produced >= self.min_tokens:
                self.tail = (self.tail + text)[-(self.window + len(text)) :]
                if any(x in self.tail for x in self.req.stop):
                    self.finish("stop")
                    return True
        if capped:
            self.finish("length")
            return True
        return False

    def finish(self, reason: FinishReason) -> None:
        """End the choice (end of generation, a stop, the cap, a cancellation)."""
        if self.done:
            return
        self.done = True
        rest = self.decoder.decode(b"", final=True)
        if self.held or self.holding:
            answer = "".join(self.held) + rest
            if reason == "stop":  # the model ended: its answer is calls, or text
                calls = parse_calls(answer, self.tools)
                if calls:
                    self._emit_calls(calls, "tool_calls")
                    return
            else:  # cut short: the calls as far as they got, whatever their number
                cut = cut_calls(answer, self.tools)
                if cut is not None or self.required:
                    self._emit_calls(cut or (), reason)
                    return
            self.emit(Delta(text=answer, tokens=len(self.held), finish_reason=reason, index=self.index))
            return
        self.emit(Delta(text=rest, tokens=0, finish_reason=reason, index=self.index))

    def _envelope_whole(self, text: str) -> bool:
        """Read `text` into the envelope; True when that ended the choice: the envelope is
        whole, or (no parallel calls) its first call is, so nothing more is generated."""
        self.envelope.feed(text)
        envelope = self.envelope
        if envelope.broken or not (envelope.closed or (not self.req.parallel_tool_calls and envelope.complete_calls)):
            return False
        self.done = True
        self._emit_calls(envelope.calls(partial=False), "tool_calls")
        return True

    def _emit_calls(self, calls: tuple[ToolCall, ...], reason: FinishReason) -> None:
        self.emit(Delta(text="", tokens=len(self.held), finish_reason=reason, index=self.index, tool_calls=calls))


def token_logprob(
    logits_ptr: Any, n_vocab: int, tok: int, top: int, bias_ids: np.ndarray, bias_vals: np.ndarray, piece: Any
) -> TokenLogprob:
    """The chosen token's log probability under the model's distribution with the logit biases
    applied (banned tokens have none), before temperature and penalties, and the `top`
    likeliest alternatives. `piece(token) -> bytes`."""
    logits = np.ctypeslib.as_array(logits_ptr, shape=(n_vocab,))
    if len(bias_ids):
        logits = logits.copy()
        logits[bias_ids] += bias_vals
    peak = float(logits.max())
    log_norm = peak + float(np.log(np.exp(logits - peak).sum()))
    alternatives: tuple[TopLogprob, ...] = ()
    if top:
        best = np.argpartition(-logits, top)[:top]
        best = best[np.argsort(-logits[best])]
        alternatives = tuple(
            TopLogprob((raw := piece(int(i))).decode("utf-8", "replace"), float(logits[i]) - log_norm, tuple(raw))
            for i in best
        )
    raw = piece(tok)
    return TokenLogprob(raw.decode("utf-8", "replace"), float(logits[tok]) - log_norm, tuple(raw), alternatives)
