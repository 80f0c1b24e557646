"""Where a request waits for an engine slot, and how it is bound to a replica.

Every deployment has its scheduler (in this process, or in Redis for a remote engine several
gateway replicas share: core/shared_slots/). A request of an alias with several replicas
first waits in the alias's queue and is bound to a replica when dispatch takes it
(core/dispatch/, routing "cache_aware"); it then takes that replica's slot, which dispatch
only chose once the replica had room (or chose to queue there, see alias_scheduler.py).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, preempted
from laneway.core.dispatch import Dispatcher, Placement, ReplicaFigures, RoutingParams
from laneway.core.latency import LatencyModels
from laneway.core.latency.outlook import Outlook, ReplicaState
from laneway.core.pipeline.call import Call
from laneway.core.pipeline.lease import Lease
from laneway.core.pipeline.queues import queue_stats
from laneway.core.policy import LanePolicy
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.core.shared_slots import SharedScheduler, SharedSlots
from laneway.engines.base import LoadReportingEngine
from laneway.engines.registry import EngineRegistry, LiveDeployment

Scheduler = DeploymentScheduler | SharedScheduler


@dataclass(frozen=True, slots=True)
class DryRun:
    """What the pipeline would do with a prepared call now, nothing taken: `replicas`, those
    dispatch would choose among; `pick`, its choice (None when the alias binds at arrival:
    prepare's `call.deployment` is it)."""

    call: Call
    replicas: list[LiveDeployment]
    pick: Placement | None


class Waiting:
    def __init__(
        self,
        registry: EngineRegistry,
        *,
        shared_slots: SharedSlots | None,
        routing: str,
        routing_params: RoutingParams | None,
        admit_by_prediction: bool = True,
        **scheduling: Any,
    ) -> None:
        self.registry = registry
        self.admit_by_prediction = admit_by_prediction
        self.shared_slots = shared_slots
        self._scheduling = scheduling
        # Keyed by the live deployment itself: a swapped-in replacement gets its own scheduler,
        # and a retired one's goes with it.
        self._schedulers: weakref.WeakKeyDictionary[LiveDeployment, Scheduler] = weakref.WeakKeyDictionary()
        self.latency = LatencyModels()  # each replica's, learned from the requests it serves
        self.dispatch = Dispatcher(
            registry, self._capacity, routing=routing, params=routing_params, latency=self.latency, **scheduling
        )
        self.latency.on_limit = self._limit_changed

    def _capacity(self, deployment: LiveDeployment) -> int:
        return self.scheduler(deployment).capacity

    def scheduler(self, deployment: LiveDeployment) -> Scheduler:
        """The deployment's scheduler: in this process for an engine only this replica uses (one
        running in-process, or no Redis to share through), in Redis for a remote engine that
        several replicas front (core/shared_slots/). Behind an alias's dispatch, the alias
        keeps the headroom for newcomers and the background reserve: the replica's own would
        hold them back twice."""
        s = self._schedulers.get(deployment)
        if s is None:
            local = dict(self._scheduling)
            if self.dispatch.late(deployment.spec.alias, False):
                local["headroom"] = local["background_reserve"] = 0
            capacity = deployment.engine.info.max_concurrency
            if self.shared_slots is not None and deployment.shared:
                s = self.shared_slots.scheduler(deployment.spec.name, capacity, **local)
            else:  # its room: the running limit learned for it (core/latency/limit.py)
                s = DeploymentScheduler(self.latency.limit(deployment).value, **local)
            self._schedulers[deployment] = s
        return s

    def _limit_changed(self, name: str, limit: int) -> None:
        """A replica's learned running limit moved: its scheduler's room follows, and the alias's
        dispatch, which reads it, tries again. A replica whose slots are shared through Redis
        keeps the engine's (the learned limit is this gateway's alone so far)."""
        for deployment in self.registry.deployments():
            s = self._schedulers.get(deployment) if deployment.spec.name == name else None
            if isinstance(s, DeploymentScheduler):
                s.set_capacity(limit)
                self.dispatch.kick()

    def late(self, call: Call) -> bool:
        return self.dispatch.late(call.alias, call.embedding is not None)

    def admit(self, call: Call, late: bool) -> None:
        """Admission against the queue the call would wait in (raises 503 GatewayError)."""
        queue = self.dispatch.alias_scheduler(call.alias) if late else self.scheduler(call.deployment)
        if isinstance(queue, SharedScheduler):  # admission runs in Redis, on every gateway's counts
            queue.admit(call.lane, call.tenant.id, call.tenant.weight)
        else:
            # Not refusing by it, the outlook only prices a refusal: nothing predicted till then.
            outlook = self.outlook(call, late, deferred=not self.admit_by_prediction)
            if outlook is not None:  # Retry-After from the model either way; refusals where trusted and on
                outlook.refuses = outlook.refuses and self.admit_by_prediction
            queue.admit(call.lane, call.tenant.id, call.tenant.weight, outlook)

    def outlook(self, call: Call, late: bool, deferred: bool = False) -> Outlook | None:
        """The call's predicted TTFT over the replicas that could serve it (core/latency/
        outlook.py); None while one is cold, for embeddings, and for a shared engine's queue.
        It has no route yet: its whole prompt counts as uncached, and where that is past the
        bound, admission asks what each replica most likely holds (Outlook.with_cache).
        `deferred`: its figures computed when first asked (Outlook.deferred)."""
        build = Outlook.deferred if deferred else Outlook.of
        if call.embedding is not None:
            return None
        if late:
            alias = self.dispatch.alias_scheduler(call.alias)
            replicas = alias.serving(call.lane, call.needs)
            states = [ReplicaState(self.latency.of(r.spec.name), r.outstanding, self._capacity(r)) for r in replicas]

            def cache() -> list[float]:  # asked only before a refusal: it hashes the prompt
                gen = call.generation
                dispatch = self.dispatch
                route = dispatch.ticket_route(
                    gen.prompt, gen.cache_salt, call.prompt_cache_key, call.needs, gen.prompt_tokens, gen.prompt_ids
                ).route
                picker = dispatch.picker
                return [picker.candidate(r, route, self._capacity).cached_share * call.prompt_tokens for r in replicas]

            return build(states, call.prompt_tokens, cache)
        s = self.scheduler(call.deployment)
        if isinstance(s, SharedScheduler):
            return None
        # Bound at arrival: its queue is the scheduler's, its running ones the replica's. One
        # replica: dispatch estimates no cache for it (the model learned its hits as speed).
        states = [ReplicaState(self.latency.of(call.deployment.spec.name), s.running_total, s.capacity)]
        return build(states, call.prompt_tokens)

    def _timed_out(self, exc: GatewayError, call: Call, late: bool) -> None:
        """A queue timeout's Retry-After from the model: when a newcomer at the back of the lane
        now would meet the bound (at least one slot's time), where the model is warm."""
        outlook = self.outlook(call, late) if exc.code is ErrorCode.QUEUE_TIMEOUT else None
        if outlook is None:
            return
        queue = self.dispatch.alias_scheduler(call.alias) if late else self.scheduler(call.deployment)
        ahead = queue.ahead_of(call.lane) if isinstance(queue, DeploymentScheduler) else 0
        exc.retry_in(max(outlook.ttft(ahead) - call.lane.queue_timeout_s, outlook.seconds_for(1)))

    def bind_early(self, call: Call) -> None:
        """round_robin's choice at arrival (the others keep prepare's)."""
        if call.embedding is None:
            call.deployment = self.dispatch.in_turn(call.alias, call.deployment, call.lane.name, call.needs)

    async def acquire(self, lease: Lease, cost: int) -> None:
        """Wait for a slot; on return the lease holds the replica's slot and outstanding count."""
        call = lease.call
        if lease.late:
            queue = self.dispatch.alias_scheduler(call.alias)
            gen = call.generation
            route = self.dispatch.ticket_route(
                gen.prompt, gen.cache_salt, call.prompt_cache_key, call.needs, gen.prompt_tokens, gen.prompt_ids
            )
            route.pool = call.pool
            lease.placement = placement = _ticket(lease, cost, route)
            try:
                await queue.acquire(placement)
            except GatewayError as exc:
                self._timed_out(exc, call, True)
                raise
            queue.taken(placement)  # no await since the grant: the lease owns it from here
            call.deployment = placement.replica
            lease.holds_deployment = True
            chosen = placement.route.placement
            call.route_reason, call.cached_estimate = chosen.reason, chosen.cached_tokens
        elif call.embedding is None and len(self.registry.replicas(call.alias)) > 1:
            call.route_reason = self.dispatch.routing  # a baseline's choice, made at arrival
        lease.ticket = _ticket(lease, cost)
        try:
            await self.scheduler(call.deployment).acquire(lease.ticket)
        except GatewayError as exc:
            self._timed_out(exc, call, False)
            raise
        call.dispatched_at = time.perf_counter()
        self.track(call, call.dispatched_at)

    def track(self, call: Call, now: float) -> None:
        """The call holds its replica's slot from `now`: its attempt there starts in the replica's
        latency model (core/latency/), which predicts its first token and learns from it."""
        if call.embedding is None:
            target = call.lane.tpot_target_ms  # its replica's running limit is judged by it
            target_s = None if target is None else target / 1000
            call.latency = attempt = self.latency.begin(
                call.deployment, call.prompt_tokens, call.cached_estimate, now, target_s
            )
            if attempt.predicted is not None and call.predicted_ttft_s is None:  # the first attempt's
                call.predicted_ttft_s = now - call.started + attempt.predicted

    def overloaded_retry(self, exc: GatewayError, call: Call) -> None:
        """An engine error from a replica that reports itself overloaded: Retry-After the
        seconds its own queue (the waiting it reports, and one) takes to drain at its learned
        pace, where its model is warm (else the error's own)."""
        replica = call.deployment
        if exc.code is not ErrorCode.ENGINE_ERROR or not replica.overloaded:
            return
        engine = replica.engine
        load = engine.reported_load() if isinstance(engine, LoadReportingEngine) else None
        state = ReplicaState(self.latency.of(replica.spec.name), replica.outstanding, self._capacity(replica))
        period = state.slot_period()
        if period is not None:
            exc.retry_in(((load.waiting if load is not None else 0) + 1) * period)

    async def rebind(self, lease: Lease, target: LiveDeployment) -> None:
        """Move an admitted lease whose replica failed to `target` (failover, continuation): the
        old slot and outstanding count were given back when its generation ended; it waits for
        a slot there. What the answer keeps of the failed attempt is its caller's to decide."""
        call, old = lease.call, lease.ticket
        assert old is not None
        lease.ticket = None
        call.deployment = target
        target.outstanding += 1
        lease.reopen_generation()
        ticket = _ticket(lease, old.cost)
        await self.scheduler(target).acquire(ticket)
        lease.ticket = ticket
        self.track(call, time.perf_counter())

    def dry_run(self, call: Call) -> DryRun:
        """The replicas dispatch would weigh for `call` and the picker's choice, asked in a dry
        run: no queue joined, nothing recorded (no prefix index, session or figures update)."""
        if not self.late(call):
            return DryRun(call, [call.deployment], None)
        gen = call.generation
        route = self.dispatch.ticket_route(
            gen.prompt, gen.cache_salt, call.prompt_cache_key, call.needs, gen.prompt_tokens
        )
        route.pool = call.pool
        ticket = Ticket(
            request_id=call.request_id,
            tenant_id=call.tenant.id,
            weight=call.tenant.weight,
            cost=0,
            lane=call.lane,
            route=route,
        )
        replicas = self.dispatch.alias_scheduler(call.alias).candidates(ticket)
        pick = self.dispatch.picker.pick(route.route, replicas, self._capacity, dry_run=True)
        return DryRun(call, replicas, pick)

    def kick(self) -> None:
        """Dispatch again what waits in every alias's queue (a replica may be back or changed)."""
        self.dispatch.kick()

    def replica_figures(self) -> dict[str, ReplicaFigures]:
        return self.dispatch.replica_figures()

    def release(self, call: Call, ticket: Ticket | None, placement: Ticket | None) -> None:
        if ticket is not None:
            self.scheduler(call.deployment).release(ticket)
        if placement is not None:
            self.dispatch.alias_scheduler(call.alias).release(placement)

    def reject_waiting(self, error: Callable[[], BaseException]) -> None:
        for s in self.dispatch.alias_schedulers():
            s.reject_waiting(error)
        for scheduler in list(self._schedulers.values()):
            scheduler.reject_waiting(error)

    def stats(self, lanes: Sequence[LanePolicy]) -> list[tuple[dict[str, str], int, int]]:
        """Waiting and running requests per deployment and lane; requests waiting for any
        replica of an alias are listed under deployment "" (not bound yet)."""
        out = queue_stats(self.registry.deployments(), lanes, self.scheduler)
        for s in self.dispatch.alias_schedulers():
            for lane, waiting, _ in s.lane_stats():
                if waiting:
                    base = {"deployment": "", "model": s.alias, "quantization": "", "gpu_type": "", "engine": ""}
                    out.append(({**base, "lane": lane}, waiting, 0))
        return out


def _ticket(lease: Lease, cost: int, route: Any = None) -> Ticket:
    """The lease's place in a queue: the alias's (with its `route`) or its replica's. A
    background request's ticket carries how it gives its slot back when a foreground one needs it."""
    call = lease.call
    ticket = Ticket(
        request_id=call.request_id,
        tenant_id=call.tenant.id,
        weight=call.tenant.weight,
        cost=cost,
        lane=call.lane,
        route=route,
    )
    if call.lane.background:
        ticket.preempt = lambda: lease.interrupt(preempted())
    return ticket
