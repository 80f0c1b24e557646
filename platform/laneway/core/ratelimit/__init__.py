"""Per-tenant and per-key limits: RPM and TPM token buckets, max concurrent requests, and
token quotas per UTC day and month.

At admission a request reserves 1 request and prompt + max_tokens tokens; when it ends the
tokens it did not use are refunded. A bucket of capacity C refills at C per minute, so the
Retry-After of a refusal is exactly when the bucket can hold the request. An API key's own
limits (TenantSnapshot.key_*) are enforced in addition to its tenant's, in buckets of its own.

Quotas (core/quota.py) count the tokens of every tenant per calendar period (so a quota set
mid-month applies to the month's real use, and admins see it); a request that would take a
tenant past a quota is refused until the period resets. Reserved like TPM, refunded like TPM.

Two backends with one contract: process memory (one gateway), and Redis (one atomic Lua
script per decision, on Redis's clock, so any number of replicas enforce one limit; the
quota periods come from the limiter's wall clock, which tests inject; far from a tenant's
limits a replica admits at once on Redis's last answer, see headroom.py). Both count quotas
from the usage table when their counters are gone: memory at start-up, Redis when a counter
turns out lost (counter_recovery.py).

One job per module: errors.py (the refusals), protocol.py (RateLimiter, Reservation, the
readings), memory.py, redis_limiter.py, headroom.py, redis_keys.py, counter_recovery.py, and
the Lua scripts as `.lua` files (scripts.py reads them).
"""

from laneway.core.ratelimit.errors import (
    check_size,
    key_rate_limited,
    key_too_many_concurrent,
    rate_limited,
    too_large,
    too_many_concurrent,
)
from laneway.core.ratelimit.headroom import ADMIT_AT_ONCE_FOR_S, ADMIT_AT_ONCE_UNANSWERED, Headroom
from laneway.core.ratelimit.memory import MemoryRateLimiter, TokenBucket
from laneway.core.ratelimit.protocol import LimiterReadings, RateLimiter, Reservation, SharedLimitReadings
from laneway.core.ratelimit.redis_limiter import RedisRateLimiter
from laneway.core.ratelimit.script_calls import COUNTER_GRACE_S, STALE_HOLDER_S
from laneway.core.ratelimit.settle_queue import SETTLE_LINGER_S

__all__ = [
    "ADMIT_AT_ONCE_FOR_S",
    "ADMIT_AT_ONCE_UNANSWERED",
    "COUNTER_GRACE_S",
    "SETTLE_LINGER_S",
    "STALE_HOLDER_S",
    "Headroom",
    "LimiterReadings",
    "MemoryRateLimiter",
    "RateLimiter",
    "RedisRateLimiter",
    "Reservation",
    "SharedLimitReadings",
    "TokenBucket",
    "check_size",
    "key_rate_limited",
    "key_too_many_concurrent",
    "rate_limited",
    "too_large",
    "too_many_concurrent",
]
