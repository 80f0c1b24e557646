"""The Dispatcher: how the gateway places requests on an alias's replicas, per the `routing`
setting.

- "cache_aware": a generation request of an alias with several replicas waits in the alias's
  AliasScheduler and is bound when dispatch takes it (alias_scheduler.py, picker.py).
- "least_outstanding" (what laneway did before): bound at arrival to the replica with the
  fewest requests (Registry.resolve), then waits in that replica's queue.
- "round_robin": bound at arrival to the next replica in turn. A baseline for bench/routing.py.

An alias with one replica, and embeddings, always wait in the replica's own queue: there is
nothing to choose, and that queue orders them by the same rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from laneway.core.dispatch.alias_scheduler import AliasScheduler
from laneway.core.dispatch.picker import Picker, Placement, ReplicaFigures, RoutingParams
from laneway.core.dispatch.prefix_index import PrefixIndex, Route, anchor, prompt_blocks
from laneway.core.latency import LatencyModels
from laneway.core.scheduler import Ticket
from laneway.engines.registry import EngineRegistry, LiveDeployment

ROUTINGS = ("cache_aware", "least_outstanding", "round_robin")


@dataclass(eq=False)
class TicketRoute:
    """What a ticket waiting for an alias carries for dispatch."""

    route: Route
    needs: frozenset[str]
    placement: Placement | None = None
    taken: bool = False  # the request's lease holds the replica's outstanding count
    pool: str = "serving"  # the alias's pool it goes to: "serving" or "canary" (core/canary/pools.py)


class Dispatcher:
    def __init__(
        self,
        registry: EngineRegistry,
        capacity_of: Callable[[LiveDeployment], int],
        *,
        routing: str = "cache_aware",
        params: RoutingParams | None = None,
        latency: LatencyModels | None = None,
        **scheduling: Any,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)} (got {routing!r})")
        self.registry = registry
        self.routing = routing
        self.params = params or RoutingParams()
        self.index = PrefixIndex()
        self.picker = Picker(self.params, self.index, latency)
        self._capacity_of = capacity_of
        self._scheduling = scheduling
        self._aliases: dict[str, AliasScheduler] = {}
        self._turns: dict[str, itertools.count[int]] = {}
        self.placed: Callable[[Ticket, Placement], None] | None = None

    def late(self, alias: str, embedding: bool) -> bool:
        """Whether a request of `alias` waits for any replica (late binding) rather than one."""
        if self.routing != "cache_aware" or embedding:
            return False
        live = [d for d in self.registry.replicas(alias) if d.engine.info.generates and d.role != "shadow"]
        return len(live) > 1

    def alias_scheduler(self, alias: str) -> AliasScheduler:
        s = self._aliases.get(alias)
        if s is None:
            s = AliasScheduler(
                alias, lambda: self.registry.replicas(alias), self._capacity_of, self.picker, **self._scheduling
            )
            s.placed = self._placed
            self._aliases[alias] = s
        return s

    def _placed(self, ticket: Ticket, placement: Placement) -> None:
        if self.placed is not None:
            self.placed(ticket, placement)

    def alias_schedulers(self) -> list[AliasScheduler]:
        return list(self._aliases.values())

    def ticket_route(
        self,
        prompt: str,
        salt: str | None,
        key: str | None,
        needs: frozenset[str],
        prompt_tokens: int,
        token_ids: tuple[int, ...] | None = None,
    ) -> TicketRoute:
        size = self.params.block_bytes
        blocks = prompt_blocks(prompt, salt, size)
        session = None if key is None else f"{salt or ''}\0{key}"
        tokens_per_block = prompt_tokens * size / max(len(prompt.encode("utf-8", "surrogatepass")), 1)
        route = Route(blocks, anchor(prompt, salt, key, blocks, size), session, tokens_per_block, token_ids, salt)
        return TicketRoute(route, needs)

    def in_turn(self, alias: str, chosen: LiveDeployment, lane: str, needs: frozenset[str]) -> LiveDeployment:
        """round_robin: the next healthy replica of the alias in turn that serves the lane and
        has the capabilities the request needs; else `chosen` (Registry.resolve's choice)."""
        if self.routing != "round_robin":
            return chosen
        same = [
            d
            for d in self.registry.replicas(alias)
            if d.engine.info.generates
            and d.healthy
            and not d.draining
            and d.role != "shadow"
            and needs <= d.engine.info.capabilities
            and lane in d.spec.config.get("lanes", (lane,))
        ]
        if len(same) < 2:
            return chosen
        turn = next(self._turns.setdefault(alias, itertools.count()))
        return same[turn % len(same)]

    def replica_figures(self) -> dict[str, ReplicaFigures]:
        """Per replica: requests placed by dispatch, their prompt tokens and the estimated cached ones."""
        return dict(self.picker.figures)

    def kick(self) -> None:
        """Dispatch again everywhere (after a health check: a replica may be back)."""
        for s in self._aliases.values():
            s.kick()
