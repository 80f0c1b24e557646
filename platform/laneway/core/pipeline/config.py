"""GatewayConfig: the Gateway's tuning in one value, decided once at start.

Ten keyword arguments of the Gateway's once, beside its services: one frozen value says what
they are, lets the runtime build it from the settings in one line (`from_settings`), and
lets a test or a benchmark change the one field it means (`GatewayConfig(default_max_tokens=32)`).
The defaults are the ones tests and benchmarks have always run with; the settings' own
defaults (settings.py) are what a serving process gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laneway.core.canary.watch import Margins
from laneway.core.dispatch import RoutingParams
from laneway.settings import Settings


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    default_max_tokens: int = 512  # prepare's max_tokens when neither the request nor a task sets one
    # The schedulers (core/scheduler.py): the fair order's quantum, the share a starved lane
    # gets, the slots kept for newcomers and the ones background work may not take.
    quantum: int = 64
    starvation_share: float = 0.1
    headroom: int = 1
    background_reserve: int = 1
    # Dispatch across an alias's replicas (core/dispatch/): its routing and the scorers' weights.
    routing: str = "cache_aware"
    routing_params: RoutingParams | None = None
    admit_by_prediction: bool = True  # refuse at once what the (trusted) latency model says cannot meet its bound
    # Failover before the first byte (core/pipeline/failover.py): tries per request, and each
    # deployment's retry budget (a share of its requests over a window, never under a minimum).
    max_tries: int = 2
    continuation: bool = True  # mid-answer failures continue on another replica (continuation.py)
    # A stall without inter_token_timeout_s: no token for this multiple of the replica's learned
    # decode step, and never less than the floor (failover.StallRule; multiple 0: off).
    stall_multiple: float = 20.0
    stall_floor_s: float = 5.0
    retry_ratio: float = 0.1
    retry_minimum: int = 3
    retry_window_s: float = 10.0
    # Engine swaps (core/canary/): when laneway rolls a canary back, and the shadow lane's width.
    canary_margins: Margins = field(default_factory=Margins)
    shadow_concurrency: int = 4

    @classmethod
    def from_settings(cls, settings: Settings) -> GatewayConfig:
        return cls(
            default_max_tokens=settings.default_max_tokens,
            quantum=settings.scheduler_quantum,
            starvation_share=settings.lane_starvation_share,
            headroom=settings.scheduler_headroom_slots,
            background_reserve=settings.background_reserve_slots,
            routing=settings.routing,
            routing_params=RoutingParams.from_settings(settings),
            admit_by_prediction=settings.admit_by_predicted_ttft,
            max_tries=settings.failover_max_tries,
            continuation=settings.continuation,
            stall_multiple=settings.stall_itl_multiple,
            stall_floor_s=settings.stall_floor_s,
            retry_ratio=settings.retry_budget_ratio,
            retry_minimum=settings.retry_budget_min,
            retry_window_s=settings.retry_budget_window_s,
            canary_margins=Margins(
                error_margin=settings.canary_error_margin,
                ttft_margin=settings.canary_ttft_margin,
                min_requests=settings.canary_min_requests,
                window_s=settings.canary_window_s,
            ),
            shadow_concurrency=settings.shadow_concurrency,
        )
