"""Late binding: the requests of an alias with several replicas wait in one fair queue (the
alias's lanes, weighted fair across tenants, as core/scheduler.py orders them), and each is
bound to a replica only when dispatch takes it, so the choice sees the load and the cache as
they are then, not as they were when it arrived.

Dispatch runs while some replica has a free slot: it takes the next request in fair order and
lets the picker choose among the replicas that can serve it. The picker may choose a replica
that is full (its cache saves more than the wait costs, within the imbalance guard): the
request then waits in that replica's own queue, which this alias's dispatch alone feeds.

Lane caps hold per replica, as they do for one deployment; the headroom is the alias's: while
several tenants use it and only `headroom` slots are free across its replicas, only a tenant
running nothing gets one. Admission reads this queue (its depth, its predicted wait over all
the replicas' slots).

Background lanes (batch work) are the alias's too: one is dispatched only while no foreground
request here could be, its reserve counts the free slots across the replicas, and it is bound
to a replica with a free slot whenever one can serve it, not queued on a full one, where it
would take the slot that frees ahead of a foreground request waiting here (the replicas' own
reserve is 0).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

from laneway.core.dispatch.picker import Picker, Placement
from laneway.core.latency.outlook import Outlook
from laneway.core.policy import LanePolicy
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.engines.registry import LiveDeployment, in_pool


class AliasScheduler(DeploymentScheduler):
    def __init__(
        self,
        alias: str,
        replicas: Callable[[], list[LiveDeployment]],
        capacity_of: Callable[[LiveDeployment], int],
        picker: Picker,
        *,
        headroom: int = 1,
        **local: Any,
    ) -> None:
        super().__init__(1, headroom=0, **local)
        self.alias = alias
        self._replicas = replicas
        self._capacity_of = capacity_of
        self.picker = picker
        self._alias_headroom = headroom
        # Per replica and lane: requests this dispatch bound there and not yet released.
        self._bound: weakref.WeakKeyDictionary[LiveDeployment, dict[str, int]] = weakref.WeakKeyDictionary()
        self.placed: Callable[[Ticket, Placement], None] | None = None  # a hook for metrics and tests

    # ---- which replicas, and their room ----
    def usable(self) -> list[LiveDeployment]:
        """The replicas to place on: not draining, healthy (a probing replica only while it runs
        nothing) and not overloaded, else every one (a request never fails here for want of a
        healthy replica: the engine call then fails it over or reports the error)."""
        # A shadow takes no client's request (core/canary/shadow.py copies some to it).
        generating = [r for r in self._replicas() if r.engine.info.generates and r.role != "shadow"]
        replicas = [r for r in generating if not r.draining] or generating
        healthy = [r for r in replicas if r.healthy and not (r.probing and r.outstanding)] or replicas
        return [r for r in healthy if not r.overloaded] or healthy

    def _free(self, r: LiveDeployment) -> int:
        return self._capacity_of(r) - r.outstanding

    def free_slots(self) -> int:
        return sum(max(0, self._free(r)) for r in self.usable())

    def has_room(self) -> bool:
        usable = self.usable()
        self.capacity = sum(self._capacity_of(r) for r in usable)
        return any(self._free(r) > 0 for r in usable)

    def lane_open(self, name: str) -> bool:
        cap = self._lanes[name].cap
        return any(self._free(r) > 0 and self._bound.get(r, {}).get(name, 0) < cap for r in self.usable())

    def lane_slots(self, lane: LanePolicy) -> int:
        return min(lane.cap * max(len(self.usable()), 1), self.capacity)

    def _eligible(self) -> Callable[[int], bool]:
        free = sum(max(0, self._free(r)) for r in self.usable())
        if not self._alias_headroom or self.capacity < 4 or free > self._alias_headroom or not self._several_tenants():
            return lambda _: True
        return lambda tid: tid not in self._tenant_running

    def admit(self, lane: LanePolicy, tenant_id: int, weight: float, outlook: Outlook | None = None) -> None:
        """Admission over the alias's queue: a lane's depth limit is per replica, as it is for a
        replica's own queue, so the alias's queue holds as many as its replicas' would."""
        self.has_room()  # the alias's capacity as it is now (replicas come and go)
        replicas = max(len(self.usable()), 1)
        if replicas > 1:
            lane = dataclasses.replace(lane, max_queue_depth=lane.max_queue_depth * replicas)
        super().admit(lane, tenant_id, weight, outlook)

    # ---- binding ----
    def candidates(self, ticket: Ticket) -> list[LiveDeployment]:
        """The replicas that may serve the ticket, as Registry.resolve chooses them: those with
        the capabilities it needs; of those, the ones serving its lane; of those, the ones
        dedicated to its lane while one has a free slot; of those, its pool's (serving or canary,
        chosen in prepare: core/canary/pools.py) while its pool has one."""
        return in_pool(self.serving(ticket.lane, ticket.route.needs), ticket.route.pool)

    def serving(self, lane_policy: LanePolicy, needs: frozenset[str]) -> list[LiveDeployment]:
        """candidates() for a request of `lane_policy` needing `needs` (admission asks too)."""
        lane = lane_policy.name
        replicas = self.usable()
        able = [r for r in replicas if needs <= r.engine.info.capabilities] or replicas
        serving = [r for r in able if lane in r.spec.config.get("lanes", (lane,))] or able
        dedicated = [r for r in serving if lane in r.spec.config.get("lanes", ()) and self._free(r) > 0]
        if lane_policy.background:
            return dedicated or [r for r in serving if self._free(r) > 0] or serving
        return dedicated or serving

    def _place(self, ticket: Ticket) -> None:
        placement = self.picker.pick(ticket.route.route, self.candidates(ticket), self._capacity_of)
        replica = placement.replica
        replica.outstanding += 1  # counted at once: the next placement in this loop sees it
        lanes = self._bound.setdefault(replica, {})
        lanes[ticket.lane.name] = lanes.get(ticket.lane.name, 0) + 1
        ticket.replica = replica
        ticket.route.placement = placement
        if self.placed is not None:
            self.placed(ticket, placement)

    def taken(self, ticket: Ticket) -> None:
        """The request's lease now holds the replica's outstanding count (it ends it itself)."""
        ticket.route.taken = True

    def release(self, ticket: Ticket) -> None:
        if ticket.granted is None:
            return
        replica: LiveDeployment = ticket.replica
        if not ticket.route.taken:  # granted, but its waiter left in the same instant
            replica.outstanding -= 1
        lanes = self._bound.get(replica)
        if lanes is not None:
            lanes[ticket.lane.name] -= 1
        super().release(ticket)

    def kick(self) -> None:
        """Try again to dispatch (a replica came back, or changed)."""
        self._dispatch()
