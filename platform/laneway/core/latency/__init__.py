"""The latency model per replica, learned online (docs/latency-model.md)."""

from laneway.core.latency.fit import DecayedFit
from laneway.core.latency.limit import ConcurrencyLimit
from laneway.core.latency.models import LatencyModels
from laneway.core.latency.replica import (
    HALF_LIFE_S,
    Attempt,
    LatencyReadings,
    ReplicaLatencyModel,
    curve_points,
)

__all__ = [
    "HALF_LIFE_S",
    "Attempt",
    "ConcurrencyLimit",
    "DecayedFit",
    "LatencyModels",
    "LatencyReadings",
    "ReplicaLatencyModel",
    "curve_points",
]
