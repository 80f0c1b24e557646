"""Continuation after the first byte: a replica that fails mid-answer does not cut the client's
answer. The request goes to another replica of its alias (failover's rules: not one that failed
it, the retry budget, the tries) as a continuation of what the client already has, and the new
replica's deltas flow into the same response: one id, no text twice, none missing, one
finish_reason, one usage.

What carries across the seam is the Answer: each choice's stop matcher (a stop string split
across the seam still stops), its early stop, the tokens it produced (max_tokens counts across
replicas) and the text the engine generated, which the next replica continues (the tail a stop
matcher still holds included: the engine did generate it).

Some answers cannot continue faithfully, and end as before, with an error event (`refusal`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from laneway.core.early_stops import JSON_MODES, AnswerStops
from laneway.core.pipeline.call import Call
from laneway.core.stops import StopMatcher
from laneway.engines.base import EngineError
from laneway.engines.registry import LiveDeployment
from laneway.types import Continuation, Delta, FinishReason, GenerationRequest


class LateEngineFailure(Exception):
    """The engine failed after some of the answer reached its consumer: it may continue elsewhere."""

    def __init__(self, error: EngineError, reason: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.reason = reason


class Answer:
    """One request's answer as it is built, across the replicas that serve it in turn."""

    def __init__(self, call: Call) -> None:
        gen = call.generation
        n = gen.n
        ext = gen.extensions
        keep = bool(ext is not None and ext.include_stop_str_in_output)
        self.request: GenerationRequest = gen  # what the engine of the current attempt is asked
        self.matchers = [StopMatcher(gen.stop, keep_stop=keep) for _ in range(n)]
        # min_tokens: stops are not looked for in a choice's first tokens (as vLLM does).
        self.unstoppable = (ext.min_tokens or 0) if ext is not None and gen.stop else 0
        self.produced = [0] * n
        # The task's early stop per choice (core/early_stops.py), read on the text the stop
        # strings let through.
        self.early = AnswerStops(call.early_rule, n) if call.early_rule is not None else None
        self.reasons: list[FinishReason | None] = [None] * n
        self.left = n
        self.relayed = False  # a delta reached the consumer
        # choice 0's text as the engine gave it, in pieces (joined only for a continuation)
        self.generated: list[str] = []
        self.tool_calls = False  # tool-call fragments were relayed
        self.continuations = 0
        self.prefill_estimate = 0  # the current continuation's prompt tokens, until its engine says
        self.seam_from: float | None = None  # when the failure a continuation answers was seen

    def exhausted(self, call: Call) -> bool:
        """Choice 0 already has all the tokens it may: it ended at its length, nothing to continue."""
        return self.produced[0] >= call.generation.max_tokens

    def at_length(self) -> list[Delta]:
        """The last deltas of the choices still open, ended at their length."""
        out = []
        for i, reason in enumerate(self.reasons):
            if reason is None:
                self.reasons[i] = "length"
                out.append(Delta(text=self.matchers[i].flush(), tokens=0, finish_reason="length", index=i))
        self.left = 0
        return out

    @staticmethod
    def suitable(call: Call) -> Callable[[LiveDeployment], bool]:
        """Which replicas can continue the call's answer: those whose engine continues answers,
        and, when logprobs were asked for, of the failed replica's kind (their scale)."""
        kind = call.deployment.engine.info.engine

        def suits(target: LiveDeployment) -> bool:
            info = target.engine.info
            return info.continues and (call.generation.logprobs is None or info.engine == kind)

        return suits

    def refusal(self, call: Call) -> str | None:
        """Why this answer cannot continue faithfully on any replica, or None."""
        gen = call.generation
        if gen.n > 1:
            return "n > 1"
        if self.tool_calls:
            return "a tool call was under way"
        if (gen.response_format or {}).get("type") in JSON_MODES:
            return "a JSON grammar cannot be resumed"
        if gen.extensions is not None and gen.extensions.structured_outputs is not None:
            return "a structured-output grammar cannot be resumed"
        return None

    def continue_on(self, call: Call) -> GenerationRequest:
        """The request that continues the answer: what was generated, and what is left of max_tokens."""
        gen = call.generation
        done = self.produced[0]
        ext = gen.extensions
        if ext is not None and ext.min_tokens:
            ext = replace(ext, min_tokens=max(0, ext.min_tokens - done))
        self.request = replace(
            gen,
            max_tokens=gen.max_tokens - done,
            prompt_tokens=gen.prompt_tokens + done,
            extensions=ext,
            continuation=Continuation("".join(self.generated), done),
        )
        self.continuations += 1
        self.prefill_estimate = self.request.prompt_tokens
        call.continued_prompt_tokens += self.prefill_estimate
        self.seam_from = time.perf_counter()
        return self.request

    def prefilled(self, call: Call, tokens: int) -> None:
        """The engine's count of a prompt: the request's own, or a continuation's prefill."""
        if not self.continuations:
            call.reported_prompt_tokens = tokens
            return
        call.continued_prompt_tokens += tokens - self.prefill_estimate
        self.prefill_estimate = tokens

    def seam_closed(self, call: Call) -> None:
        """The first delta after a seam reaches the consumer: how long the seam took."""
        if self.seam_from is not None:
            call.seam_seconds.append(time.perf_counter() - self.seam_from)
            self.seam_from = None
