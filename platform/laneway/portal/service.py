"""What a portal user can see and do, each function scoped by its tenant (the first argument,
taken from the session by the routes, never from the request): its keys (list, issue within
the caps its operator set, revoke), its usage, its limits and what is left of them, and its
recent refusals. A key of another tenant is not found (404), as one that does not exist.

Usage is read by `usage_summary` alone: today through the admin's usage statistics
(db/usage_stats.py) scoped by the tenant; it is the one function to switch when usage
rollups land."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from msgspec import Struct

from laneway.admin import keys as admin_keys
from laneway.admin.keys import KEY_FIELDS, KeyIn
from laneway.admin.limits import KeyModels, tenant_usage
from laneway.admin.names import check_display_name
from laneway.admin.service import AdminService, get_or_404, row
from laneway.admin.validation import ExpiresDays, KeyName, Positive
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.prices import from_micros
from laneway.core.quota import period as quota_period
from laneway.core.ratelimit import RateLimiter
from laneway.db.models import Tenant
from laneway.db.portal_repositories import TenantKeys, key_caps, refusals_since
from laneway.db.portal_tables import DEFAULT_MAX_KEYS, PortalKeyCaps
from laneway.db.repositories import UsageRepository
from laneway.db.usage_stats import Period, UsageStatsRepository, UsageSummary
from laneway.portal.refusals import in_words

CAP_FIELDS = ("max_keys", "allowed_models", "max_rpm", "max_tpm", "max_concurrency")
# What a portal user is shown of a key: no budgets (the operator's), never the secret.
PORTAL_KEY_FIELDS = tuple(f for f in KEY_FIELDS if not f.startswith("budget_"))
MAX_KEYS_PAGE = 100


class PortalKeyIn(Struct, forbid_unknown_fields=True):
    """POST /portal/api/keys: a name, an expiry, and limits within the tenant's caps."""

    name: KeyName = "default"
    expires_days: ExpiresDays | None = None
    rpm: Positive | None = None
    tpm: Positive | None = None
    max_concurrency: Positive | None = None
    allowed_models: KeyModels | None = None


class CapsIn(Struct, forbid_unknown_fields=True):
    """PUT /admin/api/tenants/{id}/portal/caps: null lifts a cap (the tenant's own limits apply)."""

    max_keys: Positive = DEFAULT_MAX_KEYS
    allowed_models: KeyModels | None = None
    max_rpm: Positive | None = None
    max_tpm: Positive | None = None
    max_concurrency: Positive | None = None


def caps_of(found: PortalKeyCaps | None) -> dict[str, Any]:
    if found is None:
        return {"max_keys": DEFAULT_MAX_KEYS, **dict.fromkeys(CAP_FIELDS[1:])}  # no row: the defaults
    return {f: getattr(found, f) for f in CAP_FIELDS}


async def get_caps(svc: AdminService, tenant_id: int) -> dict[str, Any]:
    async with svc.sessions() as session:
        await get_or_404(session, Tenant, tenant_id)
        return caps_of(await key_caps(session, tenant_id))


async def list_keys(svc: AdminService, tenant_id: int, *, after: int | None, limit: int) -> dict[str, Any]:
    """A page of the tenant's keys, newest first: {"data", "has_more", "last_id"}."""
    async with svc.sessions() as session:
        found = await TenantKeys(session, tenant_id).page(after=after, limit=limit + 1)
    data = [row(k, PORTAL_KEY_FIELDS) for k in found[:limit]]
    return {"data": data, "has_more": len(found) > limit, "last_id": data[-1]["id"] if data else None}


def _within(caps: dict[str, Any], data: PortalKeyIn) -> dict[str, Any]:
    """The key's limits: those asked for, each at most its cap; a cap not asked about is the key's."""
    limits: dict[str, Any] = {}
    for field in ("rpm", "tpm", "max_concurrency"):
        asked, cap = getattr(data, field), caps[f"max_{field}" if field != "max_concurrency" else field]
        if asked is not None and cap is not None and asked > cap:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"{field} {asked} is above the {cap} your operator allows for a key; ask for at most {cap}.",
                param=field,
            )
        limits[field] = asked if asked is not None else cap
    allowed = caps["allowed_models"]
    models = data.allowed_models
    if models is not None and allowed is not None:
        outside = [m for m in models if m not in allowed]
        if outside:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"allowed_models names {', '.join(repr(m) for m in outside)}, which your keys may not use "
                f"(they may use: {', '.join(allowed) or 'none'}).",
                param="allowed_models",
            )
    limits["allowed_models"] = models if models is not None else allowed
    return limits


async def create_key(svc: AdminService, actor: str, tenant_id: int, data: PortalKeyIn) -> dict[str, Any]:
    """A new key of the tenant within its caps; its secret is in the answer once, as `key`."""
    check_display_name("name", data.name)
    now = datetime.now(UTC)
    async with svc.sessions() as session:
        caps = caps_of(await key_caps(session, tenant_id))
        live = await TenantKeys(session, tenant_id).live_count(now)
    if live >= caps["max_keys"]:
        raise GatewayError(
            ErrorCode.CONFLICT,
            f"You have {live} live keys, the most your operator allows ({caps['max_keys']}); revoke one first.",
            param="max_keys",
        )
    limits = _within(caps, data)
    issued = await admin_keys.issue_api_key(
        svc, actor, tenant_id, KeyIn(name=data.name, expires_days=data.expires_days, **limits)
    )
    out = {f: issued[f] for f in PORTAL_KEY_FIELDS}
    return {**out, "key": issued["secret"]}  # shown once; only its sha256 is stored


async def revoke_key(svc: AdminService, actor: str, tenant_id: int, key_id: int) -> dict[str, Any]:
    async with svc.sessions() as session:
        if await TenantKeys(session, tenant_id).get(key_id) is None:
            raise GatewayError(ErrorCode.NOT_FOUND, f"No key with id {key_id}.")
    revoked = await admin_keys.revoke_api_key(svc, actor, key_id)
    return {f: revoked[f] for f in PORTAL_KEY_FIELDS}


async def usage_summary(svc: AdminService, tenant_id: int, period: Period) -> UsageSummary:
    """The tenant's usage over `period`: the one place the portal reads usage from."""
    async with svc.sessions() as session:
        return await UsageStatsRepository(session).summary(tenant_id, period)


async def usage(
    svc: AdminService, tenant_id: int, period: Period, summary: UsageSummary | None = None
) -> dict[str, Any]:
    """The JSON of the tenant's usage (`summary`: already read for this tenant and period)."""
    summary = summary or await usage_summary(svc, tenant_id, period)
    async with svc.sessions() as session:
        ids = [int(s.name) for s in summary.by_key if s.name.isdigit()]
        names = await TenantKeys(session, tenant_id).names(ids)

    def spend(name: str, s: Any) -> dict[str, Any]:
        return {"name": name, "requests": s.requests, "tokens": s.tokens, "cost": from_micros(s.cost_micros)}

    t = summary.totals
    return {
        "period": period.key,
        "start": summary.start.isoformat(),
        "end": summary.end.isoformat(),
        "currency": svc.currency,
        "totals": {
            "requests": t.requests,
            "errors": t.errors,
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
            "cost": from_micros(t.cost_micros),
        },
        "buckets": [
            {
                "start": b.start.isoformat(),
                "requests": b.figures.requests,
                "tokens": b.figures.prompt_tokens + b.figures.completion_tokens,
                "cost": from_micros(b.figures.cost_micros),
            }
            for b in summary.buckets
        ],
        "by_model": [spend(s.name, s) for s in summary.by_model],
        "by_key": [
            {
                **spend(names.get(int(s.name), "-") if s.name.isdigit() else "-", s),
                "key_id": int(s.name) if s.name.isdigit() else None,
            }
            for s in summary.by_key
        ],
    }


async def limits(svc: AdminService, limiter: RateLimiter, tenant_id: int) -> dict[str, Any]:
    """The tenant's rate limits, its token quotas and money budgets: used, left, when each resets."""
    async with svc.sessions() as session:
        tenant = await get_or_404(session, Tenant, tenant_id)
        quotas = await tenant_usage(limiter, session, tenant)
        now = limiter.wall_clock()
        budgets: dict[str, Any] = {}
        for kind, limit in (("day", tenant.budget_per_day), ("month", tenant.budget_per_month)):
            p = quota_period(kind, now)
            spent = sum((await UsageRepository(session).cost_since(p.start, tenant_id)).values())
            budgets[kind] = {
                "spent": from_micros(spent),
                "limit": from_micros(limit),
                "left": None if limit is None else from_micros(max(0, limit - spent)),
                "resets_at": quotas[kind]["resets_at"],
            }
        caps = caps_of(await key_caps(session, tenant_id))
    return {
        "rate": {"rpm": tenant.rpm, "tpm": tenant.tpm, "max_concurrency": tenant.max_concurrency},
        "allowed_models": tenant.allowed_models,
        "quotas": {k: quotas[k] for k in ("day", "month")},
        "budgets": budgets,
        "currency": svc.currency,
        "key_caps": caps,
    }


async def refusals(svc: AdminService, tenant_id: int, days: int = 7) -> dict[str, Any]:
    """The tenant's 429s and 503s of the last `days` days by code, with why in words."""
    since = datetime.now(UTC) - timedelta(days=days)
    async with svc.sessions() as session:
        found = await refusals_since(session, tenant_id, since)
    return {
        "since": since.isoformat(),
        "data": [
            {
                "status": status,
                "code": code,
                "count": n,
                "last_at": last.isoformat() if last else None,
                "reason": in_words(code),
            }
            for status, code, n, last in found
        ],
    }
