"""Money budgets: a tenant's and an API key's spend per UTC day and calendar month, in
micro-units of the currency (core/prices.py), counted the way token quotas are (core/quota.py):
a counter per period, named by its owner and period, reserved at a request's most cost and
settled at its cost. In Redis the counters live beside the token quotas' and are decided by
the same reserve script; in memory, beside them in the memory limiter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.prices import from_micros
from laneway.core.quota import PERIOD_KINDS, Period, period, rfc3339
from laneway.types import TenantSnapshot

_WORDS = {"day": "daily", "month": "monthly"}


@dataclass(frozen=True, slots=True)
class Budget:
    owner: str  # "tenant" | "key"
    period: Period
    limit: int  # micro-units
    name: str  # its counter: "cost:day:2026-03-31", "key:7:cost:month:2026-03"


# Called once per budget and period when its spend passes the soft threshold (the limiter's
# alert_share of it): the tenant, the budget, what it has spent (reservations in flight
# included). On the event loop: it must not block (usage/budget_alerts.py queues the webhook).
AlertHook = Callable[[TenantSnapshot, Budget, int], None]


def counter_name(key_id: int | None, p: Period) -> str:
    return f"cost:{p.name}" if key_id is None else f"key:{key_id}:cost:{p.name}"


def owner_of(name: str) -> int | None:
    """The API key a budget counter belongs to (None: its tenant's); see counter_name."""
    return int(name.split(":", 2)[1]) if name.startswith("key:") else None


def budgets(tenant: TenantSnapshot, now: float) -> list[Budget]:
    """The budgets that apply to a request of this tenant and key now, the tenant's first."""
    out = []
    limits = (
        ("tenant", None, tenant.budget_per_day, tenant.budget_per_month),
        ("key", tenant.api_key_id, tenant.key_budget_per_day, tenant.key_budget_per_month),
    )
    for owner, key_id, per_day, per_month in limits:
        for kind, limit in zip(PERIOD_KINDS, (per_day, per_month), strict=True):
            if limit:
                p = period(kind, now)
                out.append(Budget(owner, p, limit, counter_name(key_id, p)))
    return out


def _whose(tenant: TenantSnapshot, b: Budget) -> str:
    return f"Tenant '{tenant.name}'" if b.owner == "tenant" else f"API key {tenant.api_key_id} of '{tenant.name}'"


def budget_exceeded(tenant: TenantSnapshot, b: Budget, spent: int, now: float) -> GatewayError:
    """429 budget_exceeded: whose budget, what is spent, and when it resets (Retry-After and
    X-Laneway-Budget-Reset)."""
    reset = rfc3339(b.period.resets_at)
    error = GatewayError(
        ErrorCode.BUDGET_EXCEEDED,
        f"{_whose(tenant, b)} has spent {from_micros(spent)} of its {_WORDS[b.period.kind]} budget of "
        f"{from_micros(b.limit)} (a request reserves its most cost: prompt + max_tokens at the "
        f"model's price). The budget resets at {reset} (UTC).",
        retry_after=b.period.seconds_left(now),
    )
    error.headers["X-Laneway-Budget-Reset"] = reset
    return error


def budget_too_small(tenant: TenantSnapshot, b: Budget, cost: int) -> GatewayError:
    """A request whose most cost exceeds a whole fresh budget: waiting would not help."""
    return GatewayError(
        ErrorCode.REQUEST_TOO_LARGE,
        f"Request too large: it may cost {from_micros(cost)} (prompt + max_tokens at the model's "
        f"price) and {_whose(tenant, b)} has a {_WORDS[b.period.kind]} budget of {from_micros(b.limit)}. "
        "Lower max_tokens or shorten the prompt.",
    )
