"""Per-key limits and tenant quotas for the admin operations (admin/keys.py and admin/tenants.py write them):
the fields an admin may send, the rule that a key only narrows its tenant, and what a
tenant has used of its quotas, read from the rate limiter's counters (the usage table when
those cannot be read). Admin reads only: nothing here runs on the request path."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.admin.validation import ModelAlias, MoneyBudget, Positive
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.quota import PERIOD_KINDS, period, rfc3339
from laneway.core.ratelimit import RateLimiter
from laneway.db.models import Tenant
from laneway.db.repositories import UsageRepository

KEY_LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency", "allowed_models", "budget_per_day", "budget_per_month")
KeyModels = Annotated[list[ModelAlias], Meta(max_length=1000)]


class KeyLimitsIn(Struct, omit_defaults=True, forbid_unknown_fields=True):
    """PATCH /admin/api/keys/{id}: the key's own limits; null clears one (the tenant's applies)."""

    rpm: Positive | None = None
    tpm: Positive | None = None
    max_concurrency: Positive | None = None
    allowed_models: KeyModels | None = None
    # The key's own money budgets (micro-units), in addition to its tenant's.
    budget_per_day: MoneyBudget | None = None
    budget_per_month: MoneyBudget | None = None


_LIMIT_WORDS = {"rpm": "RPM", "tpm": "TPM", "max_concurrency": "max concurrency"}


def check_key_limits(tenant: Tenant, values: dict[str, Any]) -> None:
    """A key can only narrow its tenant: a limit above the tenant's, or a model the tenant may
    not use, would never take effect, so it is refused in words that say why."""
    for field, words in _LIMIT_WORDS.items():
        value, ceiling = values.get(field), getattr(tenant, field)
        if value is not None and ceiling is not None and value > ceiling:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"{field} {value} is above tenant '{tenant.name}''s {words} of {ceiling}; a key's limits can only "
                f"narrow its tenant's. Use at most {ceiling}, or leave it empty for the tenant's.",
                param=field,
            )
    models = values.get("allowed_models")
    if models is not None and tenant.allowed_models is not None:
        outside = [m for m in models if m not in tenant.allowed_models]
        if outside:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"allowed_models names {', '.join(repr(m) for m in outside)}, which tenant '{tenant.name}' may not "
                f"use (it may use: {', '.join(tenant.allowed_models) or 'none'}).",
                param="allowed_models",
            )
    if models == []:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            "allowed_models must name at least one model; leave it empty (null) for every model the tenant may use.",
            param="allowed_models",
        )


async def _used_from_records(session: AsyncSession, tenant_id: int, now: float) -> dict[str, int]:
    repo = UsageRepository(session)
    return {
        kind: (await repo.tokens_since(period(kind, now).start, tenant_id)).get(tenant_id, 0) for kind in PERIOD_KINDS
    }


async def tenant_usage(limiter: RateLimiter, session: AsyncSession, tenant: Tenant) -> dict[str, Any]:
    """Today's and this month's tokens next to the tenant's quotas, with when each resets.

    From the limiter's counters (what it enforces, reservations in flight included); when
    Redis cannot answer, from the usage table (finished requests only), and it says so."""
    now = limiter.wall_clock()
    try:
        used, source = await limiter.quota_used(tenant.id), "limiter"
    except (RedisError, OSError):
        used, source = await _used_from_records(session, tenant.id, now), "usage_records"
    out: dict[str, Any] = {"source": source}
    for kind in PERIOD_KINDS:
        p = period(kind, now)
        limit = tenant.tokens_per_day if kind == "day" else tenant.tokens_per_month
        out[kind] = {
            "period": p.name.split(":", 1)[1],
            "used": used[kind],
            "limit": limit,
            "left": None if limit is None else max(0, limit - used[kind]),
            "resets_at": rfc3339(p.resets_at),
        }
    return out
