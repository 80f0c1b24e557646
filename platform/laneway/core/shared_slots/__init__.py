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

Modules: slots.py (SharedSlots: the Redis side, one per replica), scheduler.py (SharedScheduler:
one per shared deployment), backend.py (what a scheduler needs of SharedSlots), and the Lua
scripts as `.lua` files (scripts.py reads them), all called through the process's Redis hub.
"""

from laneway.core.shared_slots.backend import SlotsBackend, SlotsUnavailable, SlotWaiter, fallback_share
from laneway.core.shared_slots.scheduler import SharedScheduler
from laneway.core.shared_slots.slots import SharedSlots

__all__ = ["SharedScheduler", "SharedSlots", "SlotWaiter", "SlotsBackend", "SlotsUnavailable", "fallback_share"]
