"""Token quotas over calendar periods in UTC: a day (resets at 00:00 UTC) and a month (resets
at 00:00 UTC on the 1st).

A period is named by its kind and start ("day:2026-03-31", "month:2026-03"); a counter of the
tokens used in it lives under that name (process memory, or a Redis key), so a new period
starts from zero without anyone resetting anything, and a settle gives its refund back to
the period its reservation was taken from, even after the boundary.

The limiter's wall clock (seconds since the epoch) says which period is current: injectable,
so a test crosses midnight without waiting for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.types import TenantSnapshot

PERIOD_KINDS = ("day", "month")
_WORDS = {"day": "daily", "month": "monthly"}


@dataclass(frozen=True, slots=True)
class Period:
    kind: str  # "day" | "month"
    name: str  # "day:2026-03-31" | "month:2026-03": the counter's name
    start: datetime  # UTC
    resets_at: datetime  # the next period's start (UTC)

    def seconds_left(self, now: float) -> float:
        return max(0.0, self.resets_at.timestamp() - now)


def period(kind: str, now: float) -> Period:
    """The `kind` period that contains `now` (epoch seconds). Every reservation asks for both
    kinds: the current ones are kept, with their bounds in epoch seconds, while `now` is in them."""
    hit = _current.get(kind)
    if hit is not None and hit[0] <= now < hit[1]:
        return hit[2]
    found = _period(kind, now)
    _current[kind] = (found.start.timestamp(), found.resets_at.timestamp(), found)
    return found


_current: dict[str, tuple[float, float, Period]] = {}


def _period(kind: str, now: float) -> Period:
    at = datetime.fromtimestamp(now, UTC)
    if kind == "day":
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        return Period(kind, f"day:{start:%Y-%m-%d}", start, start + timedelta(days=1))
    if kind == "month":
        start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        return Period(kind, f"month:{start:%Y-%m}", start, nxt)
    raise ValueError(f"unknown quota period {kind!r}")


def quota_limit(tenant: TenantSnapshot, kind: str) -> int | None:
    return tenant.tokens_per_day if kind == "day" else tenant.tokens_per_month


def quotas(tenant: TenantSnapshot, now: float) -> list[tuple[Period, int]]:
    """The tenant's quotas that apply now: (current period, tokens allowed in it)."""
    out = []
    for kind in PERIOD_KINDS:
        limit = quota_limit(tenant, kind)
        if limit:
            out.append((period(kind, now), limit))
    return out


def rfc3339(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def quota_exceeded(tenant: TenantSnapshot, p: Period, limit: int, used: int, now: float) -> GatewayError:
    """429 quota_exceeded: which quota, how much of it is used, and when it resets (Retry-After
    and X-Laneway-Quota-Reset both say so)."""
    reset = rfc3339(p.resets_at)
    error = GatewayError(
        ErrorCode.QUOTA_EXCEEDED,
        f"Tenant '{tenant.name}' has used {used} of its {_WORDS[p.kind]} quota of {limit} tokens "
        f"(prompt + max_tokens are reserved per request). The quota resets at {reset} (UTC).",
        retry_after=p.seconds_left(now),
    )
    error.headers["X-Laneway-Quota-Reset"] = reset
    return error


def quota_too_small(tenant: TenantSnapshot, kind: str, limit: int, tokens: int) -> GatewayError:
    """A request that could not fit in a whole fresh period: waiting for the reset would not help."""
    return GatewayError(
        ErrorCode.REQUEST_TOO_LARGE,
        f"Request too large: it needs {tokens} tokens (prompt + max_tokens) and tenant '{tenant.name}' "
        f"has a {_WORDS[kind]} quota of {limit} tokens. Lower max_tokens or shorten the prompt.",
    )
