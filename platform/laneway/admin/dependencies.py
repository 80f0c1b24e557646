"""The running services the admin routes are handed (runtime/services.py provides them by these names):
narrow views, so an admin page depends on what it reads and not on the whole Gateway."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from litestar.di import NamedDependency
from litestar.params import SkipValidation

from laneway.core.dispatch import ReplicaFigures
from laneway.core.ratelimit import RateLimiter
from laneway.engines.registry import EngineRegistry

# Waiting and running requests per deployment and lane: (labels, waiting, running).
QueueStats: TypeAlias = Callable[[], list[tuple[dict[str, str], int, int]]]

# Per replica: what dispatch placed there (requests, prompt tokens, estimated cached ones).
RoutingFigures: TypeAlias = Callable[[], dict[str, ReplicaFigures]]

# SkipValidation: these are the runtime's own objects, not input to check (and a Protocol or a
# callable is no type the signature model can validate).
Limiter: TypeAlias = SkipValidation[NamedDependency[RateLimiter]]  # parameter name: limiter
Registry: TypeAlias = SkipValidation[NamedDependency[EngineRegistry]]  # parameter name: registry
Queues: TypeAlias = SkipValidation[NamedDependency[QueueStats]]  # parameter name: queue_stats
Routing: TypeAlias = SkipValidation[NamedDependency[RoutingFigures]]  # parameter name: routing_figures
