"""Per-deployment scheduler: lane queues, fair across tenants, strict lane priority.

A request holds one of the deployment's engine slots from dispatch until it ends; the gateway
never gives the engine more sequences than its room (the replica's learned running limit, at
most the engine's own), so waiting happens here, where it can be ordered, not in the engine.

Choosing the next request for a free slot:
- lane: the highest-priority lane (lowest number) with waiting work and room (a lane's optional
  cap on its running sequences per deployment; a tenant under its share passes it); every
  1/starvation_share-th dispatch that passes over a waiting lower lane goes to the lane whose
  head waited longest, so lower lanes are slowed, never starved;
- background lanes (LanePolicy.background: batch work) run only in the slots the foreground
  lanes leave, and never by the starvation share. While foreground traffic is recent (within
  headroom_window_s) a background request takes a slot only if `background_reserve` slots stay
  free after it; with none recent it may take every slot;
- tenant within the lane: weighted deficit round robin on tokens (prompt + max_tokens); each
  visit adds quantum (64 tokens by default) x tenant weight to the tenant's deficit, and a
  request is served when the deficit covers its cost. A tenant under its weight's share of
  the slots is served before the round robin's turn comes (_under_share), and while several
  tenants are active the last `headroom` slots go only to a tenant running nothing: a flood
  gets its share, and cannot push others back or make them wait for its streams to end.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from laneway.core import admission
from laneway.core.admission import queue_timeout as queue_timeout  # the shared slots' scheduler raises it too
from laneway.core.lane_queue import LaneQueue
from laneway.core.policy import LanePolicy


@dataclass(eq=False)
class Ticket:
    request_id: str
    tenant_id: int
    weight: float
    cost: int  # tokens of work: prompt + max_tokens
    lane: LanePolicy
    enqueued: float = 0.0
    # Where a request waiting for any replica of its alias goes (core/dispatch/): read by the
    # dispatcher when the ticket reaches the head of the fair order, set when it is bound.
    route: Any = None
    replica: Any = None
    granted: float | None = None
    future: asyncio.Future[None] | None = None
    # A background request's way to give its slot back early (it is interrupted and runs
    # again later), and whether it was asked to.
    preempt: Callable[[], None] | None = None
    preempting: bool = False


class DeploymentScheduler:
    def __init__(
        self,
        capacity: int,
        *,
        quantum: int = 64,
        starvation_share: float = 0.1,
        headroom: int = 1,
        headroom_window_s: float = 10.0,
        background_reserve: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = max(1, capacity)
        # Held back from tenants running something while several use it, so a newcomer's first token
        # waits for no flood's stream to end (4 slots or more: smaller engines have none to spare).
        self.headroom = headroom if self.capacity >= 4 else 0
        self.headroom_window_s = headroom_window_s
        self.background_reserve = max(0, background_reserve)
        self._foreground_running = 0
        self._foreground_seen: float | None = None  # when a foreground request last queued or ended
        self._tenant_running: dict[int, int] = {}
        self._tenant_seen: dict[int, float] = {}  # tenant -> when it last asked for a slot
        self._weights: dict[int, float] = {}  # running tenant -> its weight, as its last grant said
        self.quantum = quantum
        self.starvation_every = max(1, round(1 / starvation_share)) if starvation_share > 0 else 0
        self._clock = clock
        self._queues: dict[str, LaneQueue[Ticket]] = {}
        self._lanes: dict[str, LanePolicy] = {}  # latest policy seen per lane
        self.running: dict[str, int] = {}
        self.running_total = 0
        self._granted: set[Ticket] = set()
        self._passed_over = 0
        self._service_s: dict[str, float] = {}  # EWMA of how long a request holds a slot, per lane

    # ---- introspection (admission, metrics, tests) ----
    def depth(self, lane: str) -> int:
        return q.size if (q := self._queues.get(lane)) else 0

    @property
    def waiting_total(self) -> int:
        return sum(q.size for q in self._queues.values())

    def running_tickets(self) -> list[Ticket]:
        return list(self._granted)

    def lane_stats(self) -> list[tuple[str, int, int]]:
        """(lane, waiting, running) for every lane this deployment has seen."""
        names = set(self._queues) | set(self.running)
        return [(n, self.depth(n), self.running.get(n, 0)) for n in sorted(names)]

    def tenant_depth(self, lane: str, tenant_id: int) -> int:
        q = self._queues.get(lane)
        t = q.tenants.get(tenant_id) if q else None
        return len(t.tickets) if t else 0

    def queued_weights(self, lane: str) -> dict[int, float]:
        """tenant -> weight, for the tenants with requests queued in `lane`."""
        q = self._queues.get(lane)
        return {tid: max(t.weight, 0.01) for tid, t in q.tenants.items()} if q else {}

    def ahead_of(self, lane: LanePolicy, tenant_id: int | None = None, weight: float = 1.0) -> int:
        """How many queued requests would be served before a new one from `tenant_id` joining
        `lane`: every request of a more urgent (or equally urgent) lane, and in its own lane
        what the fair order gives it: its own queued requests, and of each other tenant no
        more turns than their weights allow meanwhile (tenant None: the whole lane). A
        background lane's requests are never ahead of a foreground one's; every foreground
        request is ahead of a background one's."""
        ahead = sum(
            q.size for name, q in self._queues.items() if name != lane.name and _before(self._lanes[name], lane)
        )
        own = self._queues.get(lane.name)
        if own is None:
            return ahead
        if tenant_id is None:
            return ahead + own.size
        mine = self.tenant_depth(lane.name, tenant_id)
        turns = (mine + 1) / max(weight, 0.01)  # rounds of the fair order until it is served
        served_first = self._at_share(lane.name, tenant_id, weight)
        for tid, q in own.tenants.items():
            if tid != tenant_id and not served_first(tid):
                ahead += min(len(q.tickets), math.ceil(turns * max(q.weight, 0.01)))
        return ahead + mine

    def _at_share(self, lane: str, tenant_id: int, weight: float) -> Callable[[int], bool]:
        """Which tenants a newcomer `tenant_id` is served before: those running their weight's
        share of the slots already, where it runs less than its own (dispatch's _under_share)."""
        q = self._queues.get(lane)
        weights = {tid: max(t.weight, 0.01) for tid, t in q.tenants.items()} if q else {}
        for tid in self._tenant_running:
            weights.setdefault(tid, self._weights.get(tid, 1.0))
        weights[tenant_id] = max(weight, 0.01)
        per_weight = self.capacity / sum(weights.values())
        if len(weights) < 2 or self._tenant_running.get(tenant_id, 0) >= per_weight * weights[tenant_id]:
            return lambda _: False
        return lambda tid: self._tenant_running.get(tid, 0) >= per_weight * weights[tid]

    def evict_newest(self, lane: str, tenant_id: int, error: Callable[[], BaseException]) -> bool:
        """Refuse the newest queued request of `tenant_id` in `lane` with error() (it made way
        for a tenant under its share); False when it has none queued."""
        q = self._queues.get(lane)
        t = q.tenants.get(tenant_id) if q else None
        if q is None or t is None or not t.tickets:
            return False
        ticket = t.tickets[-1]
        q.remove(ticket)
        if ticket.future is not None and not ticket.future.done():
            ticket.future.set_exception(error())
        return True

    def predicted_wait(self, lane: LanePolicy, tenant_id: int | None = None, weight: float = 1.0) -> float:
        """Seconds a request joining `lane` now can expect to wait for a slot, from its place in
        the fair order (see ahead_of)."""
        service = self._service_s.get(lane.name)
        if service is None:
            return 0.0  # nothing measured yet: no basis to refuse
        ahead = self.ahead_of(lane, tenant_id, weight)
        slots = max(1, self.lane_slots(lane))
        held_back = self.background_held_back() if lane.background else 0
        free = min(slots - self.running.get(lane.name, 0), self.capacity - self.running_total - held_back)
        if ahead < free:
            return 0.0  # a slot is free for it now
        # The first slot frees as the oldest running hold ends (a whole hold overshot a stream near its end)
        oldest = min((t.granted for t in self._granted if t.granted is not None), default=self._clock())
        return max(service - (self._clock() - oldest), 0.0) + (ahead - max(free, 0)) * service / slots

    def lane_slots(self, lane: LanePolicy) -> int:
        """How many of the lane's requests may run at once here."""
        return min(lane.cap, self.capacity)

    def lane_open(self, name: str) -> bool:
        """Whether the lane may start one more request (its cap per deployment)."""
        return self.running.get(name, 0) < self._lanes[name].cap

    # ---- the slot protocol ----
    def admit(self, lane: LanePolicy, tenant_id: int, weight: float, outlook: admission.Outlook | None = None) -> None:
        """Admission against this scheduler's queues, in seconds where `outlook` predicts (503)."""
        admission.admit(self, lane, tenant_id, weight, outlook)

    def set_capacity(self, capacity: int) -> None:
        """Change how many requests may run at once (a shared engine's share of its slots)."""
        self.capacity = max(0, capacity)
        self._dispatch()

    async def acquire(self, ticket: Ticket) -> None:
        """Wait for a slot; 503 queue_timeout past the lane's queue timeout; a cancelled waiter never runs.
        No wait_for(shield(...)): on Python 3.11 it can swallow a cancellation that lands just after
        the grant, leaking the slot; a ticket granted in the same instant hands its slot straight back."""
        lane = ticket.lane
        self._lanes[lane.name] = lane
        ticket.enqueued = self._clock()
        if not lane.background:  # batch work is no newcomer to make headroom for
            self._tenant_seen[ticket.tenant_id] = ticket.enqueued
            self._foreground_seen = ticket.enqueued
        ticket.future = asyncio.get_running_loop().create_future()
        self._queues.setdefault(lane.name, LaneQueue()).push(ticket)
        self._dispatch()
        future = ticket.future
        if future.done() and not future.cancelled() and future.exception() is None:
            return  # granted just now: no wait, so no timer to arm and cancel (most requests)
        if not lane.background:
            self._preempt_background(lane.name)
        try:
            async with asyncio.timeout(lane.queue_timeout_s):
                await ticket.future
        except BaseException as exc:
            if ticket.granted is not None:  # granted in the same instant: hand the slot back
                self.release(ticket)
            else:
                self._queues[lane.name].remove(ticket)
            if isinstance(exc, TimeoutError):
                raise queue_timeout(lane, self._clock() - ticket.enqueued) from None
            raise

    def reject_waiting(self, error: Callable[[], BaseException]) -> int:  # shutdown: how many waited
        rejected = 0
        for queue in self._queues.values():
            for tenant in list(queue.tenants.values()):
                for ticket in list(tenant.tickets):
                    queue.remove(ticket)
                    if ticket.future is not None and not ticket.future.done():
                        ticket.future.set_exception(error())
                    rejected += 1
        return rejected

    def release(self, ticket: Ticket) -> None:
        if ticket.granted is None:
            return
        held = self._clock() - ticket.granted
        ticket.granted = None
        self._granted.discard(ticket)
        left = self._tenant_running.get(ticket.tenant_id, 1) - 1
        if left:
            self._tenant_running[ticket.tenant_id] = left
        else:
            self._tenant_running.pop(ticket.tenant_id, None)
            self._weights.pop(ticket.tenant_id, None)
        name = ticket.lane.name
        self.running[name] -= 1
        self.running_total -= 1
        if not ticket.lane.background:
            self._foreground_running -= 1
            self._foreground_seen = self._clock()
        prev = self._service_s.get(name)
        self._service_s[name] = held if prev is None else 0.8 * prev + 0.2 * held
        self._dispatch()

    def _several_tenants(self) -> bool:
        horizon = self._clock() - self.headroom_window_s
        for tid, seen in list(self._tenant_seen.items()):
            if seen < horizon and tid not in self._tenant_running:
                del self._tenant_seen[tid]
        return len(self._tenant_seen) > 1

    def _eligible(self) -> Callable[[int], bool]:
        """Who may take the next free slot: anyone, unless only the headroom is left and several
        tenants are active; then only a tenant running nothing yet."""
        if not self.headroom or self.capacity - self.running_total > self.headroom or not self._several_tenants():
            return lambda _: True
        return lambda tid: tid not in self._tenant_running

    def has_room(self) -> bool:
        """Whether one more request may start now."""
        return self.running_total < self.capacity

    def _place(self, ticket: Ticket) -> None:
        """Called for each ticket as it is granted (an alias's dispatcher binds it to a replica)."""

    def _dispatch(self) -> None:
        while self.has_room():
            eligible = self._eligible()
            lane = self._choose_lane(eligible)
            if lane is None:
                return
            if self._lanes[lane].background:
                eligible = _anyone  # the background reserve stands in for the tenants' headroom
            queue = self._queues[lane]
            under = self._under_share(queue, eligible) if self.lane_open(lane) else self._bent(lane, queue, eligible)
            ticket = queue.pop(self.quantum, under.__contains__ if under else eligible)
            self._place(ticket)
            ticket.granted = self._clock()
            self._granted.add(ticket)
            self._tenant_running[ticket.tenant_id] = self._tenant_running.get(ticket.tenant_id, 0) + 1
            self._weights[ticket.tenant_id] = max(ticket.weight, 0.01)
            self.running[lane] = self.running.get(lane, 0) + 1
            self.running_total += 1
            if not ticket.lane.background:
                self._foreground_running += 1
            assert ticket.future is not None
            if not ticket.future.done():
                ticket.future.set_result(None)

    def _under_share(self, queue: LaneQueue[Ticket], eligible: Callable[[int], bool]) -> set[int]:
        """The lane's waiting tenants running fewer requests than their weight's share of the slots,
        among every tenant running or waiting here: they get the next slot before the fair order's
        turn comes round, so a tenant arriving under a flood waits for the next slot that frees, not
        for its turn behind the flood's queued requests (nor, _bent, for the flood's lane cap)."""
        if not self._tenant_running or len(queue.active) + len(self._tenant_running) < 2:
            return set()
        weights = {tid: max(t.weight, 0.01) for tid, t in queue.tenants.items()}
        for tid in self._tenant_running:
            weights.setdefault(tid, self._weights.get(tid, 1.0))
        if len(weights) < 2:
            return set()
        per_weight = self.capacity / sum(weights.values())
        return {
            tid
            for tid in queue.active
            if eligible(tid) and self._tenant_running.get(tid, 0) < per_weight * weights[tid]
        }

    def free_slots(self) -> int:
        """Slots free now (an alias: across its usable replicas)."""
        return max(0, self.capacity - self.running_total)

    def foreground_recent(self) -> bool:
        """Whether a foreground request runs, or queued or ended within headroom_window_s."""
        seen = self._foreground_seen
        return self._foreground_running > 0 or (seen is not None and self._clock() - seen < self.headroom_window_s)

    def _preempt_background(self, lane: str) -> None:
        """A foreground request found no slot while background requests hold some: the most recently
        started (the least work lost) gives its slot back, one per foreground request waiting."""
        if not self.lane_open(lane):
            return  # it waits for its own lane's cap, not for a slot a batch line holds
        waiting = sum(q.size for name, q in self._queues.items() if not self._lanes[name].background)
        running = [t for t in self._granted if t.lane.background and t.preempt is not None]
        asked = sum(t.preempting for t in running)
        victims = sorted((t for t in running if not t.preempting), key=lambda t: t.granted or 0.0, reverse=True)
        for victim in victims[: max(0, waiting - asked)]:
            victim.preempting = True
            assert victim.preempt is not None
            victim.preempt()

    def background_held_back(self) -> int:
        """Slots a background request leaves free: the reserve while foreground traffic is recent."""
        if self.capacity < 2 or not self.foreground_recent():
            return 0
        return self.background_reserve

    def _choose_lane(self, eligible: Callable[[int], bool]) -> str | None:
        waiting = [n for n, q in self._queues.items() if q.size and (self.lane_open(n) or self._bent(n, q, eligible))]
        foreground = [n for n in waiting if not self._lanes[n].background and self._queues[n].ready(eligible)]
        if foreground:
            return self._foreground_lane(foreground)
        background = [n for n in waiting if self._lanes[n].background]
        if not background or self.free_slots() - 1 < self.background_held_back():
            return None
        return min(background, key=lambda n: self._lanes[n].priority)

    def _bent(self, name: str, queue: LaneQueue[Ticket], eligible: Callable[[int], bool]) -> set[int]:
        """Who a foreground lane at its cap still takes: a tenant under its share whose own streams do
        not fill the cap (a ceiling for the hog, not a wall for a tenant waiting on the hog's)."""
        lane = self._lanes[name]
        cap = 0 if lane.background else lane.cap  # a background lane never bends
        mine = [t.tenant_id for t in self._granted if t.lane.name == name]
        return {tid for tid in self._under_share(queue, eligible) if mine.count(tid) < cap}

    def _foreground_lane(self, ready: list[str]) -> str:
        """Strict priority among the foreground lanes ready now, but every starvation_every-th
        pass over a waiting lower lane serves the one whose head waited longest."""
        ready.sort(key=lambda n: self._lanes[n].priority)
        top = ready[0]
        lower = [n for n in ready if self._lanes[n].priority > self._lanes[top].priority]
        if not lower or not self.starvation_every:
            return top
        self._passed_over += 1
        if self._passed_over >= self.starvation_every:
            self._passed_over = 0
            return min(lower, key=lambda n: self._queues[n].head_enqueued())
        return top


def _anyone(_: int) -> bool:
    return True


def _before(other: LanePolicy, lane: LanePolicy) -> bool:
    """Whether `other`'s queued requests are served before a request joining `lane`."""
    if other.background != lane.background:
        return lane.background
    return other.priority <= lane.priority
