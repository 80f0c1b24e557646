"""API keys: issuing one (its secret made here, only its sha256 stored), and the admin
operations on keys (issue with the key's own limits, edit those limits, revoke), audited.
The first start's demo key is issued here too (bootstrap.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from msgspec import Struct
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.admin.limits import KEY_LIMIT_FIELDS, KeyLimitsIn, KeyModels, check_key_limits
from laneway.admin.service import AdminService, get_or_404, row
from laneway.admin.validation import ExpiresDays, KeyName, MoneyBudget, Positive
from laneway.core.auth import new_api_key
from laneway.db.models import ApiKey, Tenant
from laneway.db.repositories import AuditRepository, TenantRepository

KEY_FIELDS = (
    "id",
    "tenant_id",
    "name",
    "prefix",
    "created_at",
    "expires_at",
    "revoked_at",
    "last_used_at",
    *KEY_LIMIT_FIELDS,
)


class KeyIn(Struct, forbid_unknown_fields=True):
    name: KeyName = "default"
    expires_days: ExpiresDays | None = None
    # The key's own limits, in addition to the tenant's (admin/limits.py); null: the tenant's only.
    rpm: Positive | None = None
    tpm: Positive | None = None
    max_concurrency: Positive | None = None
    allowed_models: KeyModels | None = None
    budget_per_day: MoneyBudget | None = None  # micro-units of the currency
    budget_per_month: MoneyBudget | None = None


async def issue_key(
    sessions: async_sessionmaker[AsyncSession], tenant_name: str, *, name: str = "default", expires_at: Any = None
) -> tuple[int, str]:
    """A new key for the tenant named `tenant_name`: (its id, its secret). Not audited: the
    admin operation (issue_api_key) and the first start call it."""
    secret, prefix, digest = new_api_key()
    async with sessions() as session, session.begin():
        repo = TenantRepository(session)
        tenant = await repo.get_by_name(tenant_name)
        if tenant is None:
            raise LookupError(f"no tenant named {tenant_name!r}")
        key = await repo.add_key(tenant, prefix=prefix, secret_sha256=digest, name=name, expires_at=expires_at)
        return key.id, secret


def expires_at(data: KeyIn) -> datetime | None:
    """When a key issued with `data` expires (validated: 0 < expires_days <= 36500)."""
    return datetime.now(UTC) + timedelta(days=data.expires_days) if data.expires_days is not None else None


async def issue_api_key(svc: AdminService, actor: str, tenant_id: int, data: KeyIn) -> dict[str, Any]:
    expires = expires_at(data)
    limits = {f: getattr(data, f) for f in KEY_LIMIT_FIELDS if getattr(data, f) is not None}
    async with svc.sessions() as session:
        tenant = await get_or_404(session, Tenant, tenant_id)
        check_key_limits(tenant, limits)  # before the key exists: refused means nothing issued
        name = tenant.name
    key_id, secret = await issue_key(svc.sessions, name, name=data.name, expires_at=expires)
    async with svc.sessions() as session, session.begin():
        key = await get_or_404(session, ApiKey, key_id)
        for field, value in limits.items():  # nobody holds the secret yet: no request saw it without them
            setattr(key, field, value)
        await session.flush()
        after = row(key, KEY_FIELDS)
        await AuditRepository(session).add(actor, "issue", "api_key", str(key_id), None, after)
    return {**after, "secret": secret}  # shown once; only its sha256 is stored


async def edit_api_key(
    svc: AdminService, actor: str, key_id: int, data: KeyLimitsIn, fields: set[str]
) -> dict[str, Any]:
    """Set the key's own limits named in `fields` (null clears one: the tenant's applies)."""
    changes = {f: getattr(data, f) for f in fields & set(KEY_LIMIT_FIELDS)}
    async with svc.sessions() as session, session.begin():
        key = await get_or_404(session, ApiKey, key_id)
        check_key_limits(await get_or_404(session, Tenant, key.tenant_id), changes)
        before = row(key, KEY_FIELDS)
        for field, value in changes.items():
            setattr(key, field, value)
        await session.flush()
        after = row(key, KEY_FIELDS)
        await AuditRepository(session).add(actor, "update", "api_key", str(key_id), before, after)
    svc.drop_cached_keys()  # the key's next request has them
    await svc.config_changes.notify()
    return after


async def revoke_api_key(svc: AdminService, actor: str, key_id: int) -> dict[str, Any]:
    async with svc.sessions() as session, session.begin():
        key = await get_or_404(session, ApiKey, key_id)
        before = row(key, KEY_FIELDS)
        key.revoked_at = key.revoked_at or datetime.now(UTC)
        await session.flush()
        after = row(key, KEY_FIELDS)
        await AuditRepository(session).add(actor, "revoke", "api_key", str(key_id), before, after)
    svc.drop_cached_keys()
    await svc.config_changes.notify()
    return after
