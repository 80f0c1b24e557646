"""One lane's queue on one deployment: its waiting requests per tenant, served in weighted deficit
round robin on tokens (see core/scheduler.py for how a lane is chosen)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """What the queue reads of a waiting request (core/scheduler.py's Ticket)."""

    @property
    def tenant_id(self) -> int: ...
    @property
    def weight(self) -> float: ...
    @property
    def cost(self) -> int: ...  # tokens of work: what the deficit must cover
    @property
    def enqueued(self) -> float: ...


T = TypeVar("T", bound=Queued)


@dataclass(eq=False)
class TenantQueue(Generic[T]):
    weight: float
    tickets: deque[T] = field(default_factory=deque)
    deficit: float = 0.0


class LaneQueue(Generic[T]):
    def __init__(self) -> None:
        self.tenants: dict[int, TenantQueue[T]] = {}
        self.active: deque[int] = deque()  # round-robin order of tenants with waiting tickets
        self.size = 0

    def push(self, t: T) -> None:
        q = self.tenants.get(t.tenant_id)
        if q is None:
            q = self.tenants[t.tenant_id] = TenantQueue[T](weight=t.weight)
        q.weight = t.weight  # an admin's weight change applies to the next visit
        if not q.tickets:
            self.active.append(t.tenant_id)
        q.tickets.append(t)
        self.size += 1

    def remove(self, t: T) -> bool:
        q = self.tenants.get(t.tenant_id)
        if q is None or t not in q.tickets:
            return False
        q.tickets.remove(t)
        self.size -= 1
        if not q.tickets:
            self._retire(t.tenant_id)
        return True

    def _retire(self, tenant_id: int) -> None:
        self.active.remove(tenant_id)
        del self.tenants[tenant_id]  # an idle tenant keeps no credit

    def head_enqueued(self) -> float:
        return min(self.tenants[tid].tickets[0].enqueued for tid in self.active)

    def ready(self, eligible: Callable[[int], bool]) -> bool:
        return any(eligible(tid) for tid in self.active)

    def pop(self, quantum: float, eligible: Callable[[int], bool] = lambda _: True) -> T:
        """The next ticket in weighted deficit round robin among the eligible tenants (the
        caller checked ready()); tenants that are not eligible keep their place and credit."""
        while True:
            for _ in range(len(self.active)):
                tid = self.active[0]
                if not eligible(tid):
                    self.active.rotate(-1)
                    continue
                q = self.tenants[tid]
                head = q.tickets[0]
                if q.deficit >= head.cost:  # serve; it keeps the turn while its credit lasts
                    q.deficit -= head.cost
                    q.tickets.popleft()
                    self.size -= 1
                    if not q.tickets:
                        self._retire(tid)
                    return head
                q.deficit += quantum * max(q.weight, 0.01)
                self.active.rotate(-1)
            # A whole round served nobody (requests far bigger than the quantum): credit the
            # rounds until the first tenant can pay at once instead of looping through them.
            rounds = min(
                math.ceil((q.tickets[0].cost - q.deficit) / (quantum * max(q.weight, 0.01)))
                for q in (self.tenants[t] for t in self.active if eligible(t))
            )
            if rounds > 1:
                for t in self.active:
                    if eligible(t):
                        self.tenants[t].deficit += (rounds - 1) * quantum * max(self.tenants[t].weight, 0.01)
