"""Dispatch across an alias's replicas: late binding, cache- and load-aware placement."""

from laneway.core.dispatch.dispatcher import ROUTINGS, Dispatcher, TicketRoute
from laneway.core.dispatch.picker import Picker, Placement, ReplicaFigures, RoutingParams
from laneway.core.dispatch.prefix_index import PrefixIndex, Route, prompt_blocks

__all__ = [
    "ROUTINGS",
    "Dispatcher",
    "Picker",
    "Placement",
    "PrefixIndex",
    "ReplicaFigures",
    "Route",
    "RoutingParams",
    "TicketRoute",
    "prompt_blocks",
]
