"""What a shared deployment's scheduler needs from the replica's Redis side (SharedSlots), so
that the scheduler depends on this small contract and not on the class that builds it."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Protocol


class SlotsUnavailable(Exception):
    """Redis could not be used for this call: fall back to the local share."""


def fallback_share(capacity: int, replicas: int, rank: int) -> int:
    """This replica's slots when it cannot reach Redis: the shares of all add up to capacity."""
    replicas = max(1, replicas)
    return capacity // replicas + (1 if rank < capacity % replicas else 0)


class SlotWaiter(Protocol):
    """A scheduler with members waiting in Redis: told when one is granted, or its entry lost."""

    def granted(self, member: str) -> None: ...

    def lost(self, member: str) -> None: ...


class SlotsBackend(Protocol):
    replica_id: str
    lease_ttl_s: float
    healthy: bool  # Redis usable right now (else: the local fallback share)
    replicas: int  # live replicas at the last heartbeat
    rank: int  # this replica's rank among them (its share of a fallback's remainder)
    owners: weakref.WeakValueDictionary[str, SlotWaiter]  # member -> the scheduler it waits in

    def mode_changed(self) -> asyncio.Event: ...

    async def enqueue(self, deployment: str, args: list[Any]) -> list[Any]:
        """Queue a member in Redis; SlotsUnavailable when Redis cannot be used."""
        ...

    def leave(self, deployment: str, member: str, capacity: int) -> None:
        """Tell Redis the member is gone, off the caller's path."""
