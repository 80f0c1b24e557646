"""The Redis side of this replica's shared deployments: the scripts' calls through the hub,
the grant channel (pub/sub), the heartbeat, and whether Redis is usable right now."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from typing import Any

from redis.exceptions import RedisError

from laneway.core.dependencies import DependencyHealth
from laneway.core.redis_hub import RedisHub
from laneway.core.shared_slots.backend import SlotsUnavailable, SlotWaiter
from laneway.core.shared_slots.scheduler import SharedScheduler
from laneway.core.shared_slots.scripts import ENQUEUE, HEARTBEAT, LEAVE

log = logging.getLogger("laneway.shared_slots")


class SharedSlots:
    """The Redis side shared by every shared deployment of this replica: scripts, the grant
    channel, the heartbeat, and whether Redis is usable right now."""

    def __init__(
        self,
        redis: str | RedisHub,
        prefix: str = "laneway:",
        *,
        replica_id: str | None = None,
        lease_ttl_s: float = 3.0,
        timeout_s: float = 0.25,
        max_connections: int = 64,
        health: DependencyHealth | None = None,
    ) -> None:
        """`redis`: a URL (a hub of its own, closed with it) or the process's shared hub (its
        owner closes it; `timeout_s` and `max_connections` are then the hub's)."""
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.prefix = f"{prefix}slots:"
        self.lease_ttl_s = lease_ttl_s
        self._owns_hub = isinstance(redis, str)  # a hub of its own: closed with it
        # A loop turn's enqueues, leaves and heartbeats: one write, run in the order made.
        self.hub = (
            RedisHub(redis, timeout_s=timeout_s, max_connections=max_connections) if isinstance(redis, str) else redis
        )
        self._health = health or DependencyHealth()
        self.healthy = True
        self.replicas = 1  # live replicas at the last heartbeat (1: assume alone until told)
        self.rank = 0
        self._mode_changed: asyncio.Event = asyncio.Event()
        # Every live scheduler (a deployment being swapped out has one beside its successor's),
        # and which scheduler waits for which member, to route grants.
        self._schedulers: weakref.WeakSet[SharedScheduler] = weakref.WeakSet()
        self.owners: weakref.WeakValueDictionary[str, SlotWaiter] = weakref.WeakValueDictionary()
        self._tasks: list[asyncio.Task[None]] = []

    def scheduler(self, name: str, capacity: int, **local: Any) -> SharedScheduler:
        """The scheduler of a deployment whose slots this replica shares (local: its fallback's settings)."""
        s = SharedScheduler(self, name, capacity, **local)
        self._schedulers.add(s)
        return s

    def keys(self, deployment: str) -> list[str]:
        base = f"{self.prefix}{{{deployment}}}:"  # one hash slot per deployment (Redis Cluster)
        return [base + "held", base + "wait", base + "wexp", base + "meta", base + "live"]

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen(), name="slot-grants"),
            asyncio.create_task(self._beat(), name="slot-heartbeat"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._owns_hub:
            await self.hub.close()

    # ---- health ----
    def mode_changed(self) -> asyncio.Event:
        """An event set at the next switch between global and local mode."""
        return self._mode_changed

    def _switch(self, healthy: bool) -> None:
        if healthy == self.healthy:
            return
        self.healthy = healthy
        event, self._mode_changed = self._mode_changed, asyncio.Event()
        event.set()
        for s in list(self._schedulers):
            s.mode_switched()
        if healthy:
            self._health.recovered("redis")

    def left(self, reply: asyncio.Future[Any]) -> None:
        """A leave's reply: a fault switches to the fallback like any call's."""
        if not reply.cancelled() and isinstance(reply.exception(), RedisError | OSError):
            self.fault(reply.exception())  # type: ignore[arg-type]

    def fault(self, exc: BaseException) -> SlotsUnavailable:
        self._health.failed("redis", exc, "engine slots shared by replicas: using this replica's share")
        self._switch(False)
        return SlotsUnavailable(str(exc))

    async def enqueue(self, deployment: str, args: list[Any]) -> list[Any]:
        if not self.healthy:
            raise SlotsUnavailable("redis is unavailable")
        try:
            reply: list[Any] = await self.hub.call(ENQUEUE, self.keys(deployment), [self.prefix, deployment, *args])
        except (RedisError, OSError) as exc:
            raise self.fault(exc) from None
        return reply

    def leave(self, deployment: str, member: str, capacity: int) -> None:
        """Tell Redis the member is gone (released, or no longer waiting), off the caller's path
        (batched with the loop turn's other calls); if Redis is unreachable, its lease or queue
        entry expires by itself."""
        if not self.healthy:
            return
        args = [self.prefix, deployment, member, capacity, self.lease_ttl_s]
        self.hub.call(LEAVE, self.keys(deployment), args).add_done_callback(self.left)

    # ---- background: grants pushed to this replica, and the heartbeat ----
    async def _listen(self) -> None:
        while True:
            client = self.hub.subscriber()
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(f"{self.prefix}grant:{self.replica_id}")
                    while True:
                        message = await pubsub.get_message(timeout=1.0)
                        if message is not None:
                            deployment, _, member = message["data"].decode().partition("|")
                            self._route_grant(deployment, member)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the heartbeat's reconciliation covers lost grants
                log.debug("grant channel lost (%s); resubscribing", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _beat(self) -> None:
        while True:
            await self.heartbeat()
            await asyncio.sleep(self.lease_ttl_s / 3)

    def _route_grant(self, deployment: str, member: str) -> None:
        owner = self.owners.get(member)
        if owner is not None:
            owner.granted(member)
            return
        # A grant reaches a replica twice when Redis grants a waiter just before a heartbeat
        # (pub/sub and the heartbeat's reply both say so): the second notice finds the request
        # running under its lease, which must stay. Only a grant nobody here holds or waits
        # for (the request left meanwhile) is given back.
        schedulers = [s for s in self._schedulers if s.name == deployment]
        if any(member in s._held for s in schedulers):
            return
        if schedulers:
            self.leave(deployment, member, schedulers[0].capacity)

    async def heartbeat(self) -> None:
        """Renew this replica's leases, learn the replica count; the probe that ends a fallback."""
        by_name: dict[str, list[SharedScheduler]] = {}
        for s in list(self._schedulers):
            by_name.setdefault(s.name, []).append(s)
        for name, group in by_name.items():
            held: list[str] = []
            waiting: list[str] = []
            for s in group:
                h, w = s.members()
                held += h
                waiting += w
            args: list[Any] = [self.replica_id, group[-1].capacity, self.lease_ttl_s, len(held), *held, *waiting]
            try:
                # In the batch's order with the enqueues and leaves: a leave made after these
                # members were listed runs after the renewal that would otherwise re-add them.
                out = await self.hub.call(HEARTBEAT, self.keys(name), [self.prefix, name, *args])
            except (RedisError, OSError) as exc:
                self.fault(exc)
                return
            values = [v.decode() if isinstance(v, bytes) else v for v in out]
            self.replicas, self.rank = int(values[0]), int(values[1])
            split = values.index("#")
            for member in values[2:split]:
                self._route_grant(name, member)
            for member in values[split + 1 :]:
                owner = self.owners.get(member)
                if owner is not None:
                    owner.lost(member)
        self._switch(True)
        for s in list(self._schedulers):
            s.resize_local()
