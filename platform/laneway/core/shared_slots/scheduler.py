"""The scheduler of one deployment whose engine slots are shared by gateway replicas: its
requests queue in Redis (one fair order over every replica's), and while Redis is unusable in
a local DeploymentScheduler limited to this replica's share (see the package's docstring)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core import admission
from laneway.core.policy import LanePolicy
from laneway.core.scheduler import DeploymentScheduler, Ticket, queue_timeout
from laneway.core.shared_slots.backend import SlotsBackend, SlotsUnavailable, fallback_share


class SharedScheduler:
    """The scheduler of a deployment whose slots are shared by replicas: the pipeline uses it
    as it uses a DeploymentScheduler (admit, acquire, release, stats)."""

    def __init__(self, slots: SlotsBackend, name: str, capacity: int, **local: Any) -> None:
        self._slots = slots
        self.name = name
        self.capacity = max(1, capacity)
        self._clock: Callable[[], float] = time.monotonic
        # The fallback: this replica's share, scheduled locally (0 while Redis is usable).
        self.local = DeploymentScheduler(self.capacity, **local)
        self.local.set_capacity(0 if slots.healthy else self._share())
        self._waiting: dict[str, Ticket] = {}  # member -> ticket queued in Redis (or being queued)
        self._queued: set[str] = set()  # members whose enqueue Redis confirmed: the heartbeat's
        self._held: dict[str, Ticket] = {}  # member -> ticket running under a global lease
        self._service_s: dict[str, float] = {}

    def _member(self, ticket: Ticket) -> str:
        return f"{self._slots.replica_id}:{ticket.request_id}"

    def _share(self) -> int:
        return fallback_share(self.capacity, self._slots.replicas, self._slots.rank)

    def resize_local(self) -> None:
        """Local dispatch only while Redis is unusable, and only up to this replica's share
        minus what it still runs under global leases."""
        self.local.set_capacity(0 if self._slots.healthy else max(0, self._share() - len(self._held)))

    def mode_switched(self) -> None:
        if not self._slots.healthy:  # nobody will grant the global waiters: they re-queue locally
            for ticket in list(self._waiting.values()):
                if ticket.future is not None and not ticket.future.done():
                    ticket.future.set_result(None)  # wakes its acquire(), which sees the mode
        self.resize_local()

    # ---- introspection (metrics, admission, drain) ----
    @property
    def running_total(self) -> int:
        return len(self._held) + self.local.running_total

    @property
    def waiting_total(self) -> int:
        return len(self._waiting) + self.local.waiting_total

    def depth(self, lane: str) -> int:
        return sum(1 for t in self._waiting.values() if t.lane.name == lane) + self.local.depth(lane)

    def lane_stats(self) -> list[tuple[str, int, int]]:
        local = {n: (w, r) for n, w, r in self.local.lane_stats()}
        for t in self._waiting.values():
            w, r = local.get(t.lane.name, (0, 0))
            local[t.lane.name] = (w + 1, r)
        for t in self._held.values():
            w, r = local.get(t.lane.name, (0, 0))
            local[t.lane.name] = (w, r + 1)
        return [(n, w, r) for n, (w, r) in sorted(local.items())]

    def members(self) -> tuple[list[str], list[str]]:
        """(running "member|lane", waiting members) for the heartbeat: every running request,
        including those dispatched locally during a fallback, holds a lease in Redis."""
        running = [f"{m}|{t.lane.name}" for m, t in self._held.items()]
        running += [f"{self._slots.replica_id}:{t.request_id}|{t.lane.name}" for t in self.local.running_tickets()]
        return running, [m for m in self._waiting if m in self._queued]

    # ---- the slot protocol ----
    def admit(self, lane: LanePolicy, tenant_id: int, weight: float) -> None:
        if not self._slots.healthy:
            self.local.admit(lane, tenant_id, weight)
        # else: admission runs in Redis, on every replica's counts, when the request is enqueued

    async def acquire(self, ticket: Ticket) -> None:
        deadline = self._clock() + ticket.lane.queue_timeout_s
        ticket.enqueued = self._clock()
        while True:
            if self._slots.healthy:
                if await self._acquire_global(ticket, deadline):
                    return
            elif await self._acquire_local(ticket, deadline):
                return
            if self._clock() >= deadline:
                raise queue_timeout(ticket.lane, self._clock() - ticket.enqueued)

    async def _acquire_global(self, ticket: Ticket, deadline: float) -> bool:
        """Queue in Redis; True once granted, False if Redis became unusable meanwhile."""
        lane, member = ticket.lane, self._member(ticket)
        ticket.future = asyncio.get_running_loop().create_future()
        self._waiting[member] = ticket  # before the call: a grant may be published before its reply
        self._slots.owners[member] = self
        args = [
            member,
            lane.name,
            lane.priority,
            lane.cap,
            lane.max_queue_depth,
            ticket.tenant_id,
            max(ticket.weight, 0.01),
            max(1, ticket.cost),
            self._slots.lease_ttl_s,
            self.capacity,
            self._service_s.get(lane.name, 0.0),
            lane.queue_timeout_s,
        ]
        try:
            verdict, code, value, mine = (
                v.decode() if isinstance(v, bytes) else v for v in await self._slots.enqueue(self.name, args)
            )
        except SlotsUnavailable:
            self._waiting.pop(member, None)
            return False
        except BaseException:
            self._waiting.pop(member, None)
            self._leave_later(member)  # cancelled in flight: the entry may exist
            raise
        if verdict == "refused":
            self._waiting.pop(member, None)
            if code == ErrorCode.TENANT_QUEUE_SHARE:
                raise admission.over_share(lane, int(mine), float(value))
            if code == ErrorCode.QUEUE_FULL:
                raise admission.queue_full(lane, int(value))
            raise admission.wait_too_long(lane, float(value))
        if verdict == "granted":
            if member in self._waiting:  # (a grant published meanwhile may have come first)
                self._grant(member)
            return True
        self._queued.add(member)
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                await ticket.future
        except BaseException as exc:
            if member in self._held:  # granted in the same instant: hand the slot back
                self.release(ticket)
            elif self._waiting.pop(member, None) is not None:
                self._leave_later(member)
            if isinstance(exc, TimeoutError):
                raise queue_timeout(lane, self._clock() - ticket.enqueued) from None
            raise
        if member in self._held:
            return True
        self._waiting.pop(member, None)  # woken by a switch to local mode
        self._leave_later(member)
        return False

    async def _acquire_local(self, ticket: Ticket, deadline: float) -> bool:
        """Wait in the local fallback queue; True once granted, False if Redis came back first
        (then the request joins the global queue)."""
        mode = self._slots.mode_changed()
        waiter = asyncio.ensure_future(self.local.acquire(ticket))
        switched = asyncio.ensure_future(mode.wait())
        try:
            await asyncio.wait(
                {waiter, switched}, timeout=max(0.0, deadline - self._clock()), return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            switched.cancel()
            waiter.cancel()
            await asyncio.wait({waiter})
            if not waiter.cancelled() and waiter.exception() is None:
                self.local.release(ticket)  # granted as we were cancelled
            raise
        switched.cancel()
        if waiter.done():
            waiter.result()  # a local refusal or queue timeout propagates
            return True
        waiter.cancel()
        await asyncio.wait({waiter})
        if not waiter.cancelled() and waiter.exception() is None:
            return True  # granted locally in the same instant: keep it
        return False

    def granted(self, member: str) -> None:
        """A grant pushed by Redis (or found by the heartbeat)."""
        if member in self._held:
            return
        if member not in self._waiting:
            self._leave_later(member)  # it stopped waiting before the grant came: give it back
            return
        self._grant(member)

    def _grant(self, member: str) -> None:
        ticket = self._waiting.pop(member)
        self._queued.discard(member)
        self._slots.owners.pop(member, None)
        ticket.granted = self._clock()
        self._held[member] = ticket
        self.resize_local()
        if ticket.future is not None and not ticket.future.done():
            ticket.future.set_result(None)

    def lost(self, member: str) -> None:
        """Its queue entry expired in Redis (this replica was cut off longer than the lease)."""
        ticket = self._waiting.get(member)
        if ticket is not None and ticket.future is not None and not ticket.future.done():
            ticket.future.set_exception(
                GatewayError(
                    ErrorCode.QUEUE_TIMEOUT,
                    "The request's place in the queue was lost; retry.",
                    retry_after=1,
                )
            )

    def release(self, ticket: Ticket) -> None:
        member = self._member(ticket)
        if self._held.pop(member, None) is not None:
            if ticket.granted is not None:
                held = self._clock() - ticket.granted
                prev = self._service_s.get(ticket.lane.name)
                self._service_s[ticket.lane.name] = held if prev is None else 0.8 * prev + 0.2 * held
            ticket.granted = None
            self._leave_later(member)
            self.resize_local()
            return
        self.local.release(ticket)
        if self._slots.healthy:  # dispatched locally during a fallback: its lease goes too
            self._leave_later(member)

    def _leave_later(self, member: str) -> None:
        self._queued.discard(member)
        self._slots.owners.pop(member, None)
        self._slots.leave(self.name, member, self.capacity)

    def reject_waiting(self, error: Callable[[], BaseException]) -> int:
        rejected = self.local.reject_waiting(error)
        for ticket in list(self._waiting.values()):
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_exception(error())
                rejected += 1
        return rejected
