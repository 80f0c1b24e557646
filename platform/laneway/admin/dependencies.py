"""The running services the admin routes are handed (runtime/services.py provides them by these names):
narrow views, so an admin page depends on what it reads and not on the whole Gateway."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from litestar.di import NamedDependency
from litestar.params import SkipValidation

from laneway.admin.service import AdminService
from laneway.core.dispatch import Placement, ReplicaFigures
from laneway.core.latency import LatencyReadings
from laneway.core.pipeline.call import Call
from laneway.core.policy import PolicySnapshot
from laneway.core.ratelimit import RateLimiter
from laneway.engines.registry import EngineRegistry, LiveDeployment
from laneway.types import TenantSnapshot

# Waiting and running requests per deployment and lane: (labels, waiting, running).
QueueStats: TypeAlias = Callable[[], list[tuple[dict[str, str], int, int]]]

# Per replica: what dispatch placed there (requests, prompt tokens, estimated cached ones).
RoutingFigures: TypeAlias = Callable[[], dict[str, ReplicaFigures]]

# Per replica: what its latency model has learned (core/latency/).
LatencyFigures: TypeAlias = Callable[[], dict[str, LatencyReadings]]


@dataclass(frozen=True)
class RoutePlan:
    """What the pipeline would do with a request, decided by its own code (prepare: resolve,
    measure, policy, lane) without running it: no rate limit taken, no queue joined, nothing
    recorded. `replicas`: those dispatch would choose among; `pick`: its choice now (a dry run
    of the picker) when the alias binds late, else None (prepare's `call.deployment` is it)."""

    call: Call
    policies: PolicySnapshot
    requested_max_tokens: int | None
    default_max_tokens: int
    replicas: list[LiveDeployment]
    pick: Placement | None
    explicit_lane: str | None


# The route tester: (tenant, "chat" or "completions", the request body, its headers) -> the plan;
# a GatewayError is what laneway would answer instead.
RoutePlanner: TypeAlias = Callable[[TenantSnapshot, str, bytes, Mapping[str, str]], Awaitable[RoutePlan]]

# SkipValidation: these are the runtime's own objects, not input to check (and a Protocol or a
# callable is no type the signature model can validate).
Service: TypeAlias = NamedDependency[AdminService]  # parameter name: admin_service
Limiter: TypeAlias = SkipValidation[NamedDependency[RateLimiter]]  # parameter name: limiter
Registry: TypeAlias = SkipValidation[NamedDependency[EngineRegistry]]  # parameter name: registry
Queues: TypeAlias = SkipValidation[NamedDependency[QueueStats]]  # parameter name: queue_stats
Routing: TypeAlias = SkipValidation[NamedDependency[RoutingFigures]]  # parameter name: routing_figures
Latency: TypeAlias = SkipValidation[NamedDependency[LatencyFigures]]  # parameter name: latency_figures
Planner: TypeAlias = SkipValidation[NamedDependency[RoutePlanner]]  # parameter name: route_planner

# The alias's engine-swap comparison (core/canary/: roles, pools' figures, the shadow's).
SwapFigures: TypeAlias = Callable[[str], dict[str, Any]]
Swaps: TypeAlias = SkipValidation[NamedDependency[SwapFigures]]  # parameter name: swap_figures
