"""The one record a finished request leaves, and the sinks it goes to.

The pipeline builds it once, when the request's lease is released, and hands it to each sink:
the usage recorder (a usage row), the metrics (histograms and counters by lane, model,
quantization and GPU type). Sinks live above the core and implement OutcomeSink; the core
imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from laneway.core.pipeline.call import Call, FailedTry
from laneway.types import FinishReason


@dataclass(frozen=True, slots=True)
class Outcome:
    request_id: str  # the client's X-Request-Id when it sent one, else the gateway's
    tenant_id: int
    tenant_name: str
    api_key_id: int
    model: str  # the alias that served it (a fallback's, when one did)
    asked_model: str  # the alias the client asked for
    deployment: str
    engine: str
    quantization: str
    gpu_type: str
    lane: str
    endpoint: str
    stream: bool
    end_user: str | None
    status: int
    finish_reason: FinishReason | None
    error_code: str | None
    prompt_tokens: int
    completion_tokens: int
    # perf_counter() instants: arrival, leaving the queue, first token, the end.
    started: float
    dispatched_at: float | None
    first_token_at: float | None
    ended: float
    # Replicas that failed the request, in order (before its first byte, or mid-answer and
    # continued elsewhere); `deployment` served it.
    failed_tries: tuple[FailedTry, ...] = ()
    retry_denied: str | None = None  # "budget": a failover the retry budget refused
    # How dispatch chose its replica (core/dispatch/), and the prompt tokens it estimated the
    # replica held; None when the alias has one replica (nothing was chosen).
    route_reason: str | None = None
    cached_estimate: int = 0
    # The early stop that ended its decoding (core/early_stops.py), and the decode tokens that
    # saved, estimated against max_tokens.
    early_stop: str | None = None
    tokens_saved: int = 0
    # What it cost in micro-units of the currency, at the price captured when it was prepared
    # (core/prices.py); None when its model had no price.
    cost_micros: int | None = None
    # Its latency targets in ms (core/slo.py): TTFT the lane's or tighter as granted, TPOT the
    # lane's; None: none.
    ttft_target_ms: float | None = None
    tpot_target_ms: float | None = None
    # Continuations (core/pipeline/continuation.py): the prompt tokens their replicas prefilled
    # (laneway's cost: not billed, not in the tenant's TPM) and each seam's added latency.
    continued_prompt_tokens: int = 0
    seam_seconds: tuple[float, ...] = ()

    @property
    def continuations(self) -> int:
        """Moves that continued the answer on another replica (the others started it again)."""
        return sum(1 for t in self.moves if t.continued)

    # How far off its replica's latency model was on its time to first token, predicted when it
    # was dispatched: |predicted - actual| / actual (core/latency/); None when nothing was predicted.
    ttft_prediction_error: float | None = None

    @property
    def moves(self) -> tuple[FailedTry, ...]:
        """The failed tries after which the request went to another replica: all of them, but
        the last when it failed for good on the replica it ended on."""
        if self.failed_tries and self.failed_tries[-1].deployment == self.deployment:
            return self.failed_tries[:-1]
        return self.failed_tries

    @property
    def tries(self) -> int:
        return len(self.moves) + 1

    @property
    def queue_ms(self) -> float | None:
        return None if self.dispatched_at is None else (self.dispatched_at - self.started) * 1000

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.started) * 1000

    @property
    def tpot_ms(self) -> float | None:
        """Decode time per output token after the first; None below two tokens."""
        if self.first_token_at is None or self.completion_tokens < 2:
            return None
        return (self.ended - self.first_token_at) * 1000 / (self.completion_tokens - 1)

    @property
    def total_ms(self) -> float:
        return (self.ended - self.started) * 1000

    def slos_met(self) -> tuple[tuple[str, bool], ...]:
        """("ttft" | "tpot", met) for each target it had and can be judged on. TTFT: once it
        produced a token, or when laneway or an engine failed it before one (a 5xx, a queue
        timeout or full queue included: the target was missed); not a refusal for the tenant's
        own limits (4xx) nor a client that left (499). TPOT: once it produced two tokens.
        Embeddings have no tokens to time."""
        if self.endpoint == "embeddings":
            return ()
        judged: list[tuple[str, bool]] = []
        ttft = self.ttft_ms
        if self.ttft_target_ms is not None and (ttft is not None or self.status >= 500):
            judged.append(("ttft", ttft is not None and ttft <= self.ttft_target_ms))
        tpot = self.tpot_ms
        if self.tpot_target_ms is not None and tpot is not None:
            judged.append(("tpot", tpot <= self.tpot_target_ms))
        return tuple(judged)

    @classmethod
    def of(cls, call: Call, ended: float) -> Outcome:
        info = call.deployment.engine.info
        return cls(
            request_id=call.public_id,
            tenant_id=call.tenant.id,
            tenant_name=call.tenant.name,
            api_key_id=call.tenant.api_key_id,
            model=call.alias,
            asked_model=call.public_model,
            deployment=call.deployment.spec.name,
            engine=info.engine,
            quantization=info.quantization,
            gpu_type=info.gpu_type,
            lane=call.lane.name,
            endpoint=call.endpoint,
            stream=call.stream,
            end_user=call.end_user,
            status=call.status,
            finish_reason=call.finish_reason,
            error_code=call.error_code,
            prompt_tokens=call.prompt_tokens,
            completion_tokens=call.completion_tokens,
            started=call.started,
            dispatched_at=call.dispatched_at,
            first_token_at=call.first_token_at,
            ended=ended,
            failed_tries=tuple(call.failed_tries),
            retry_denied=call.retry_denied,
            route_reason=call.route_reason,
            cached_estimate=call.cached_estimate,
            early_stop=call.early_stop,
            tokens_saved=call.tokens_saved,
            cost_micros=call.cost_micros,
            ttft_target_ms=call.ttft_target_ms,
            tpot_target_ms=call.lane.tpot_target_ms,
            continued_prompt_tokens=call.continued_prompt_tokens,
            seam_seconds=tuple(call.seam_seconds),
            ttft_prediction_error=None if call.latency is None else call.latency.error,
        )


class OutcomeSink(Protocol):
    def finished(self, outcome: Outcome) -> None:
        """Take one finished request's record. Called on the event loop, from Lease.release:
        it must not block and must not raise."""
        ...
