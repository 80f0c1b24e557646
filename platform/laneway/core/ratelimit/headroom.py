"""How far from its limits a tenant was at Redis's latest answer: within a share of that room
a replica admits at once, without waiting for Redis (RedisRateLimiter.reserve_at_once)."""

from __future__ import annotations

import math
from typing import Any

from laneway.core.quota import quota_limit
from laneway.types import TenantSnapshot

# A replica admits at once (Headroom) on what Redis said within this long; older: Redis decides.
ADMIT_AT_ONCE_FOR_S = 1.0
# ... and while fewer than this many of its reserves admitted at once are unanswered: past it,
# requests wait for Redis again, so a Redis that falls behind slows admission (backpressure)
# instead of receiving reserves faster than it runs them.
ADMIT_AT_ONCE_UNANSWERED = 64


class Headroom:
    """What a tenant's limits (and its API key's) had left at Redis's latest answer for it, and
    what this replica has admitted at once since, not yet answered (reserve_at_once).

    Redis answers one connection's calls in order, so at each answer the requests still
    unanswered are exactly those this replica sent after it. It admits at once only while they
    stay within `share` (10 %) of the room the answer left, in every limit: so one replica never
    passes a limit, and replicas racing for the last of one pass it by at most what each
    admitted within one round trip of the others, that share of the room it last heard of.
    Below ten requests' room (1 / share) nothing is admitted at once: Redis decides each
    request, as before.
    """

    __slots__ = ("answered_at", "pending", "pending_tokens", "periods", "request_room", "tenant", "token_room")

    def __init__(self, tenant: TenantSnapshot, periods: tuple[str, ...]) -> None:
        self.tenant = tenant  # the snapshot it was measured for: an admin change makes a new one
        self.periods = periods
        self.request_room = 0.0  # the smallest room of the limits counted in requests ...
        self.token_room = 0.0  # ... and in tokens (inf: no such limit)
        self.answered_at = 0.0
        self.pending = 0  # admitted at once, not answered yet
        self.pending_tokens = 0

    def answered(self, room: list[Any], at: float) -> None:
        """Redis's room after a reserve (reserve.lua's reply, in its order); 0 where no limit is set."""
        t = self.tenant
        requests = (
            (room[0], t.rpm),
            (room[2], t.max_concurrency),
            (room[3], t.key_rpm),
            (room[5], t.key_max_concurrency),
        )
        tokens = (
            (room[1], t.tpm),
            (room[4], t.key_tpm),
            (room[6], quota_limit(t, "day")),
            (room[7], quota_limit(t, "month")),
        )
        self.request_room = min((float(r) for r, cap in requests if cap), default=math.inf)
        self.token_room = min((float(r) for r, cap in tokens if cap), default=math.inf)
        self.answered_at = at

    def admits(self, tokens: int, share: float) -> bool:
        return self.pending + 1 <= share * self.request_room and self.pending_tokens + tokens <= share * self.token_room
