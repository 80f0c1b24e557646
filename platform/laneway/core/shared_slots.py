"""One engine's slots shared by every gateway replica, through Redis.

An engine outside the gateway process (vLLM, Triton) is usually fronted by several replicas.
If each replica held max_concurrency sequences in flight, the engine would get N times its
concurrency and queue the excess itself, in FIFO order: lanes, fairness and predicted waits
would stop meaning anything. So for such a deployment the queue and the slots live in Redis,
one per deployment, and every replica's requests wait in the same order:

- held: a sorted set of slot leases (member -> expiry). A replica renews the leases of its
  running requests with one heartbeat every lease_ttl/3; a replica that dies stops renewing,
  and its slots come back when their leases expire (lease_ttl, 3 s by default).
- wait: one sorted set, ordered by lane priority, then by start-time fair queueing across
  tenants (a request's tag is max(the lane's virtual time, the tenant's last finish tag), and
  its finish tag adds cost / weight): weighted fairness over every replica's requests, not
  per process. Admission runs in the same script on the global counts: a tenant's share of
  the lane's depth, the predicted wait from its place in the global order.
- A release hands the slot to the head of the queue and PUBLISHes the grant to the replica
  that owns it (one channel per replica); the heartbeat also reports grants, so a lost
  message costs at most one heartbeat.

Round trips per request: one to enqueue (granted at once when a slot is free), one to release,
one more only for a request that leaves while queued. Per replica: one heartbeat per shared
deployment every lease_ttl/3, and one pub/sub connection.

When Redis is slow or gone (a call fails or times out), the replica falls back to its share
of the slots, max_concurrency / live replicas (the last count it saw; the remainder to the
lowest-ranked replicas so the shares add up to exactly max_concurrency), scheduled locally
by the usual DeploymentScheduler, minus what it still runs under global leases: it never
overcommits the engine. A probe (the heartbeat) brings it back; its locally dispatched
requests are then registered as held leases and its local waiters move to the global queue.
Lanes are strictly ordered by priority in the global queue (the local scheduler's
anti-starvation share does not apply there), and a full global lane refuses newcomers
(queue_full) instead of evicting the flood's newest request as the local one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from laneway.core import admission
from laneway.core.dependencies import DependencyHealth
from laneway.core.errors import GatewayError
from laneway.core.policy import LanePolicy
from laneway.core.redis_batch import ScriptPipe
from laneway.core.scheduler import DeploymentScheduler, Ticket, queue_timeout

log = logging.getLogger("laneway.shared_slots")

PRIORITY_SCALE = 1e12  # score = lane priority * PRIORITY_SCALE + start tag

# KEYS: 1 held (zset member->expiry), 2 wait (zset member->score), 3 wexp (zset member->expiry),
#       4 meta (hash of counters), 5 live (zset replica->expiry)
_COMMON = """
local held, wait, wexp, meta, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local prefix = ARGV[1]
local function unqueue(m)
  local info = redis.call('HGET', meta, 'wm:' .. m)
  redis.call('ZREM', wait, m)
  redis.call('ZREM', wexp, m)
  if not info then return nil end
  redis.call('HDEL', meta, 'wm:' .. m)
  local lane, tid, w = string.match(info, '^(.-)|(.-)|(.*)$')
  redis.call('HINCRBY', meta, 'qd:' .. lane, -1)
  if redis.call('HINCRBY', meta, 'q:' .. lane .. ':' .. tid, -1) <= 0 then
    redis.call('HDEL', meta, 'q:' .. lane .. ':' .. tid)
    redis.call('HINCRBYFLOAT', meta, 'sw:' .. lane, -tonumber(w))
    redis.call('HINCRBY', meta, 'nt:' .. lane, -1)
  end
  return lane
end
local function unhold(m)
  local lane = redis.call('HGET', meta, 'hl:' .. m)
  if redis.call('ZREM', held, m) == 1 and lane then
    redis.call('HINCRBY', meta, 'run:' .. lane, -1)
  end
  redis.call('HDEL', meta, 'hl:' .. m)
end
local function hold(m, lane, ttl)
  if redis.call('ZADD', held, now + ttl, m) == 1 then
    redis.call('HINCRBY', meta, 'run:' .. lane, 1)
  end
  redis.call('HSET', meta, 'hl:' .. m, lane)
end
local function cleanup()
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', held, '-inf', now)) do unhold(m) end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', wexp, '-inf', now)) do unqueue(m) end
  redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
end
-- Hand free slots to the head of the queue (skipping lanes at their cap); publish each grant
-- to the replica that owns the request, except `quiet` (the caller, who learns it directly).
local function grant_next(cap, ttl, dep, quiet)
  local granted = {}
  local free = cap - redis.call('ZCARD', held)
  local offset = 0
  while free > 0 do
    local batch = redis.call('ZRANGE', wait, offset, offset + 63, 'WITHSCORES')
    if #batch == 0 then break end
    local picked = false
    for i = 1, #batch, 2 do
      local m, score = batch[i], tonumber(batch[i + 1])
      local info = redis.call('HGET', meta, 'wm:' .. m)
      local lane = info and string.match(info, '^(.-)|') or nil
      local cfg = lane and redis.call('HGET', meta, 'cfg:' .. lane) or nil
      local lane_max = tonumber(cfg or '0') or 0
      local running = tonumber(redis.call('HGET', meta, 'run:' .. (lane or '')) or '0')
      if lane and running < lane_max then
        unqueue(m)
        local prio = math.floor(score / 1e12)
        redis.call('HSET', meta, 'V:' .. lane, tostring(score - prio * 1e12))
        hold(m, lane, ttl)
        table.insert(granted, m)
        if m ~= quiet then
          local replica = string.match(m, '^(.-):')
          redis.call('PUBLISH', prefix .. 'grant:' .. replica, dep .. '|' .. m)
        end
        free = free - 1
        picked = true
        break
      end
    end
    if not picked then offset = offset + 64 end
  end
  return granted
end
"""

# ARGV: prefix, dep, member, lane, priority, lane_max, depth_limit, tenant, weight, cost, ttl, cap,
#       service_s, timeout_s
_ENQUEUE = (
    _COMMON
    + """
local dep, m, lane = ARGV[2], ARGV[3], ARGV[4]
local prio, lane_max, depth_limit = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local tid, w, cost = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local ttl, cap, service, timeout = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
cleanup()
redis.call('HSET', meta, 'cfg:' .. lane, lane_max)
local mine = tonumber(redis.call('HGET', meta, 'q:' .. lane .. ':' .. tid) or '0')
local depth = tonumber(redis.call('HGET', meta, 'qd:' .. lane) or '0')
local others = tonumber(redis.call('HGET', meta, 'nt:' .. lane) or '0') - (mine > 0 and 1 or 0)
local sw = tonumber(redis.call('HGET', meta, 'sw:' .. lane) or '0') + (mine > 0 and 0 or w)
local share = math.max(1, depth_limit * w / sw)
if others > 0 and mine >= share then return {'refused', 'tenant_queue_share', tostring(share), tostring(mine)} end
if depth >= depth_limit then return {'refused', 'queue_full', tostring(depth), '0'} end
local V = tonumber(redis.call('HGET', meta, 'V:' .. lane) or '0')
local F = tonumber(redis.call('HGET', meta, 'F:' .. lane .. ':' .. tid) or '0')
local start = math.max(V, F)
local score = prio * 1e12 + start
local ahead = redis.call('ZCOUNT', wait, '-inf', '(' .. score)
local free = math.min(cap - redis.call('ZCARD', held),
                      lane_max - tonumber(redis.call('HGET', meta, 'run:' .. lane) or '0'))
if service > 0 and ahead >= free then
  local wait_s = (ahead - math.max(free, 0) + 1) * service / math.max(1, math.min(lane_max, cap))
  if wait_s > timeout then return {'refused', 'predicted_wait_exceeded', tostring(wait_s), '0'} end
end
redis.call('HSET', meta, 'F:' .. lane .. ':' .. tid, tostring(start + cost / w))
redis.call('ZADD', wait, score, m)
redis.call('ZADD', wexp, now + ttl, m)
redis.call('HSET', meta, 'wm:' .. m, lane .. '|' .. tid .. '|' .. w)
redis.call('HINCRBY', meta, 'qd:' .. lane, 1)
if redis.call('HINCRBY', meta, 'q:' .. lane .. ':' .. tid, 1) == 1 then
  redis.call('HINCRBYFLOAT', meta, 'sw:' .. lane, w)
  redis.call('HINCRBY', meta, 'nt:' .. lane, 1)
end
for _, g in ipairs(grant_next(cap, ttl, dep, m)) do
  if g == m then return {'granted', '', '0', '0'} end
end
return {'queued', '', tostring(ahead), '0'}
"""
)

# ARGV: prefix, dep, member, cap, ttl.  Returns 1 if it was held (and is now released), 0 if it
# was still waiting (now removed), -1 if neither (expired).
_LEAVE = (
    _COMMON
    + """
local dep, m, cap, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local outcome = -1
if redis.call('ZSCORE', held, m) then
  unhold(m)
  outcome = 1
elseif redis.call('ZSCORE', wait, m) then
  unqueue(m)
  outcome = 0
end
cleanup()
grant_next(cap, ttl, dep, '')
return outcome
"""
)

# ARGV: prefix, dep, replica, cap, ttl, n_held, held "member|lane"..., waiting members...
# Returns {live replicas, this replica's rank, granted waiting members..., '#', lost waiting members...}
_HEARTBEAT = (
    _COMMON
    + """
local dep, replica, cap, ttl, n_held = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
cleanup()
for i = 7, 6 + n_held do
  local m, lane = string.match(ARGV[i], '^(.*)|(.-)$')
  hold(m, lane, ttl)  -- renewed; re-added if it expired during a pause, for it still runs
end
local granted, lost = {}, {}
for i = 7 + n_held, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', wexp, m) then
    redis.call('ZADD', wexp, now + ttl, m)
  elseif redis.call('ZSCORE', held, m) then
    table.insert(granted, m)
  else
    table.insert(lost, m)
  end
end
redis.call('ZADD', live, now + ttl, replica)
grant_next(cap, ttl, dep, '')
local replicas = redis.call('ZRANGE', live, 0, -1)
table.sort(replicas)  -- by name: every replica agrees on the ranks
local rank = 0
for i, r in ipairs(replicas) do if r == replica then rank = i - 1 end end
local out = {#replicas, rank}
for _, m in ipairs(granted) do table.insert(out, m) end
table.insert(out, '#')
for _, m in ipairs(lost) do table.insert(out, m) end
return out
"""
)


def fallback_share(capacity: int, replicas: int, rank: int) -> int:
    """This replica's slots when it cannot reach Redis: the shares of all add up to capacity."""
    replicas = max(1, replicas)
    return capacity // replicas + (1 if rank < capacity % replicas else 0)


class _Unavailable(Exception):
    """Redis could not be used for this call: fall back to the local share."""


class SharedSlots:
    """The Redis side shared by every shared deployment of this replica: scripts, the grant
    channel, the heartbeat, and whether Redis is usable right now."""

    def __init__(
        self,
        url: str,
        prefix: str = "laneway:",
        *,
        replica_id: str | None = None,
        lease_ttl_s: float = 3.0,
        timeout_s: float = 0.25,
        max_connections: int = 64,
        health: DependencyHealth | None = None,
    ) -> None:
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.prefix = f"{prefix}slots:"
        self.lease_ttl_s = lease_ttl_s
        self._url = url
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._redis: Any = redis.Redis(connection_pool=pool)
        self._enqueue = self._redis.register_script(_ENQUEUE)
        self._leave = self._redis.register_script(_LEAVE)
        self._heartbeat = self._redis.register_script(_HEARTBEAT)
        # A loop turn's enqueues, leaves and heartbeats: one write, run in the order made.
        self._batch = ScriptPipe(self._redis, timeout_s=timeout_s)
        self._health = health or DependencyHealth()
        self.healthy = True
        self.replicas = 1  # live replicas at the last heartbeat (1: assume alone until told)
        self.rank = 0
        self._mode_changed: asyncio.Event = asyncio.Event()
        # Every live scheduler (a deployment being swapped out has one beside its successor's),
        # and which scheduler waits for which member, to route grants.
        self._schedulers: weakref.WeakSet[SharedScheduler] = weakref.WeakSet()
        self.owners: weakref.WeakValueDictionary[str, SharedScheduler] = weakref.WeakValueDictionary()
        self._tasks: list[asyncio.Task[None]] = []

    def scheduler(self, name: str, capacity: int, **local: Any) -> SharedScheduler:
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
        await self._batch.close()
        await self._redis.aclose()

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

    def fault(self, exc: BaseException) -> _Unavailable:
        self._health.failed("redis", exc, "engine slots shared by replicas: using this replica's share")
        self._switch(False)
        return _Unavailable(str(exc))

    async def call(self, script: Any, deployment: str, args: list[Any]) -> Any:
        if not self.healthy:
            raise _Unavailable("redis is unavailable")
        try:
            return await self._batch.call(script, self.keys(deployment), [self.prefix, deployment, *args])
        except (RedisError, OSError) as exc:
            raise self.fault(exc) from None

    # ---- background: grants pushed to this replica, and the heartbeat ----
    async def _listen(self) -> None:
        import redis.asyncio as redis

        while True:
            client: Any = redis.Redis.from_url(self._url, socket_connect_timeout=1.0, health_check_interval=10)
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
            leave_later(self, deployment, member, schedulers[0].capacity)

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
                out = await self._batch.call(self._heartbeat, self.keys(name), [self.prefix, name, *args])
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


class SharedScheduler:
    """The scheduler of a deployment whose slots are shared by replicas: the pipeline uses it
    as it uses a DeploymentScheduler (admit, acquire, release, stats)."""

    def __init__(self, slots: SharedSlots, name: str, capacity: int, **local: Any) -> None:
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
        args = [member, lane.name, lane.priority, lane.max_concurrency, lane.max_queue_depth, ticket.tenant_id,
                max(ticket.weight, 0.01), max(1, ticket.cost), self._slots.lease_ttl_s, self.capacity,
                self._service_s.get(lane.name, 0.0), lane.queue_timeout_s]  # fmt: skip
        try:
            verdict, code, value, mine = (
                v.decode() if isinstance(v, bytes) else v
                for v in await self._slots.call(self._slots._enqueue, self.name, args)
            )
        except _Unavailable:
            self._waiting.pop(member, None)
            return False
        except BaseException:
            self._waiting.pop(member, None)
            self._leave_later(member)  # cancelled in flight: the entry may exist
            raise
        if verdict == "refused":
            self._waiting.pop(member, None)
            if code == "tenant_queue_share":
                raise admission.over_share(lane, int(mine), float(value))
            if code == "queue_full":
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
            await asyncio.wait({waiter, switched}, timeout=max(0.0, deadline - self._clock()),
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
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
                    503,
                    "The request's place in the queue was lost; retry.",
                    code="queue_timeout",
                    type="service_unavailable",
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
        leave_later(self._slots, self.name, member, self.capacity)

    def reject_waiting(self, error: Callable[[], BaseException]) -> int:
        rejected = self.local.reject_waiting(error)
        for ticket in list(self._waiting.values()):
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_exception(error())
                rejected += 1
        return rejected


def leave_later(slots: SharedSlots, deployment: str, member: str, capacity: int) -> None:
    """Tell Redis the member is gone (released, or no longer waiting), off the caller's path
    (batched with the loop turn's other calls); if Redis is unreachable, its lease or queue
    entry expires by itself."""
    if not slots.healthy:
        return
    reply = slots._batch.call(slots._leave, slots.keys(deployment), [slots.prefix, deployment, member, capacity,
                                                                      slots.lease_ttl_s])  # fmt: skip
    reply.add_done_callback(slots.left)
