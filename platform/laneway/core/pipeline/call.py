"""One request as the pipeline carries it from prepare() to its outcome."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from laneway.contracts.codes import ErrorCode
from laneway.core.early_stops import EarlyStopRule
from laneway.core.policy import LanePolicy
from laneway.core.prices import Price
from laneway.types import EmbeddingRequest, FinishReason, GenerationRequest, TenantSnapshot

if TYPE_CHECKING:
    from laneway.core.latency import Attempt
    from laneway.engines.registry import LiveDeployment

# nginx's status for "the client went away first": what a handler answers a client that left
CLIENT_CLOSED = ErrorCode.CLIENT_DISCONNECTED.status


def engine_request_id(request_id: str, client_request_id: str | None) -> str:
    """The id the engine (and its logs) sees: the client's, made unique by the gateway's own,
    since engines key running requests by it."""
    return request_id if client_request_id is None else f"{client_request_id}:{request_id}"


class CallTrace(Protocol):
    """The request's lifecycle events, for a tracing sink (laneway/tracing/ implements it).
    The pipeline calls it only when a request carries one: tracing off costs a None check."""

    def engine_started(self, call: Call) -> tuple[tuple[str, str], ...]:
        """The engine call begins; returns the headers that carry the trace to the engine."""
        ...

    def engine_ended(self, call: Call) -> None: ...
    def stream_started(self) -> None: ...
    def stream_ended(self, call: Call) -> None: ...

    def finish(self, call: Call) -> None:
        """The request is over, whatever ended it (once, from Lease.release)."""
        ...


@dataclass(frozen=True, slots=True)
class FailedTry:
    """A replica that failed the call (core/pipeline/failover.py): before its first byte, or
    mid-answer, `continued` on another (core/pipeline/continuation.py)."""

    deployment: str
    reason: str
    continued: bool = False


@dataclass(eq=False)
class Call:
    request_id: str
    tenant: TenantSnapshot
    alias: str
    endpoint: str
    stream: bool
    deployment: LiveDeployment
    generation: GenerationRequest
    lane: LanePolicy
    task: str | None = None
    end_user: str | None = None  # the request's `user`: who, behind the tenant, asked
    embedding: EmbeddingRequest | None = None  # an embeddings call (its generation has max_tokens 0)
    started: float = field(default_factory=time.perf_counter)
    dispatched_at: float | None = None
    first_token_at: float | None = None
    completion_tokens: int = 0
    finish_reason: FinishReason | None = None
    error_code: ErrorCode | None = None  # why it did not end well (Call.fail); None: it did
    reported_prompt_tokens: int | None = None  # the engine's exact count, when it reports one
    client_request_id: str | None = None  # the client's own X-Request-Id (api/request_ids.py)
    trace: CallTrace | None = None  # its spans, when tracing is on: else no tracer call
    needs: frozenset[str] = frozenset()  # capabilities beyond text: any replica it moves to must have them
    failed_tries: list[FailedTry] = field(default_factory=list)  # replicas that failed it, in order
    retry_denied: str | None = None  # why it could not move on ("budget"), when that ended it
    # Continuations (core/pipeline/continuation.py): the prompt tokens their replicas prefilled
    # (the answer so far included: laneway's cost, never billed), and each seam's added latency.
    continued_prompt_tokens: int = 0
    seam_seconds: list[float] = field(default_factory=list)
    asked_alias: str | None = None  # the alias the client asked for, when a fallback (`alias`) serves it
    prompt_cache_key: str | None = None  # session affinity across replicas (core/dispatch/)
    pool: str = "serving"  # the alias's pool it was given: "serving" or "canary" (core/canary/pools.py)
    route_reason: str | None = None  # what placed it on its replica (core/dispatch/picker.py)
    cached_estimate: int = 0  # prompt tokens its replica most likely held (the prefix index)
    admission_checked: bool = False  # admission already passed (choosing among fallbacks): not again
    early_rule: EarlyStopRule | None = None  # the task's early stop for its answers (core/early_stops.py)
    early_stop: str | None = None  # the early stop that ended its decoding, if one did
    stop_sequence: str | None = None  # the stop string that ended its first choice, if one did
    tokens_saved: int = 0  # max_tokens less what the choices it cut had decoded (an estimate)
    price: Price | None = None  # its alias's price when it was prepared: its cost is at this one
    ttft_target_ms: float | None = None  # its TTFT target: the lane's, or tighter as granted (core/slo.py)
    latency: Attempt | None = None  # its attempt in its replica's latency model (core/latency/)
    # Seconds from its arrival to its first token as predicted when it took its first slot (its
    # wait so far plus the replica's model); None while that model was cold.
    predicted_ttft_s: float | None = None

    @property
    def cost_micros(self) -> int | None:
        """What it cost at the price captured at prepare (None: its alias had no price); 0 when
        it never reached an engine (refused, or it left while queued): nothing was computed."""
        if self.price is None:
            return None
        if self.dispatched_at is None or self.error_code is ErrorCode.PREEMPTED:
            return 0  # a preempted batch line's work was laneway's to discard; its rerun is billed
        return self.price.cost(self.prompt_tokens, self.completion_tokens)

    def fail(self, code: ErrorCode) -> None:
        """Record why the request did not end well; the first cause stands (a backpressure
        cut or a shutdown is not relabelled by the cancellation it causes). Its status is the
        code's (contracts/codes.py): no caller picks one."""
        if self.error_code is None:
            self.error_code = code

    @property
    def status(self) -> int:
        """What the usage row, the metrics and the trace record: 200, or its error code's status."""
        return 200 if self.error_code is None else self.error_code.status

    @property
    def public_model(self) -> str:
        """The model the answer names: always the alias the client asked for."""
        return self.asked_alias or self.alias

    @property
    def prompt_tokens(self) -> int:
        """The engine's count when it reported one, else the gateway's measurement (which may
        be an estimate: it only routed and reserved)."""
        return self.reported_prompt_tokens or self.generation.prompt_tokens

    @property
    def public_id(self) -> str:
        """The id the client and the usage row know this request by: the client's X-Request-Id
        when it sent one (not unique: never a key), else request_id. Logs name
        generation.request_id, which holds both."""
        return self.client_request_id or self.request_id

    @property
    def queue_ms(self) -> float | None:
        return None if self.dispatched_at is None else (self.dispatched_at - self.started) * 1000

    @property
    def fingerprint(self) -> str:
        return f"laneway-{self.deployment.spec.engine_kind}"
