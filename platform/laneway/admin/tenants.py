"""Admin operations on tenants: create one, edit its limits, quotas, grants, name and state."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.admin.service import AdminService, cannot_clear, get_or_404, row
from laneway.admin.validation import LaneName, ModelAlias, MoneyBudget, Positive, TenantName, TokenQuota
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.slo import MAX_TTFT_TARGET_MS
from laneway.db.models import Tenant
from laneway.db.repositories import AuditRepository

TENANT_FIELDS = (
    "id",
    "name",
    "weight",
    "rpm",
    "tpm",
    "max_concurrency",
    "allowed_models",
    "allowed_lanes",
    "priority_floor",
    "min_ttft_target_ms",
    "tokens_per_day",
    "tokens_per_month",
    "budget_per_day",
    "budget_per_month",
    "disabled",
)
PRIORITY_FLOOR_RANGE = (-1000, 1000)


class TenantIn(Struct, omit_defaults=True, forbid_unknown_fields=True):
    name: TenantName | None = None
    weight: Annotated[float, Meta(gt=0, le=100)] | None = None
    rpm: Positive | None = None
    tpm: Positive | None = None
    max_concurrency: Positive | None = None
    allowed_models: Annotated[list[ModelAlias], Meta(max_length=1000)] | None = None
    # Lanes the tenant may pick with X-Laneway-Lane (null or empty: none; the lane rules decide).
    allowed_lanes: Annotated[list[LaneName], Meta(max_length=100)] | None = None
    # The most urgent X-Laneway-Priority it may ask for (lower runs first; more urgent is clamped).
    priority_floor: Annotated[int, Meta(ge=PRIORITY_FLOOR_RANGE[0], le=PRIORITY_FLOOR_RANGE[1])] | None = None
    # The tightest X-Laneway-TTFT-Target-Ms it may ask for (tighter is clamped to it); null: it
    # may not tighten its lanes' TTFT targets (core/slo.py).
    min_ttft_target_ms: Annotated[int, Meta(ge=1, le=MAX_TTFT_TARGET_MS)] | None = None
    # Tokens (prompt + completion) per UTC day / calendar month; null: no quota.
    tokens_per_day: TokenQuota | None = None
    tokens_per_month: TokenQuota | None = None
    # Money budgets per UTC day / calendar month, in micro-units of the currency; null: none.
    budget_per_day: MoneyBudget | None = None
    budget_per_month: MoneyBudget | None = None
    disabled: bool | None = None


async def _check_name_free(session: AsyncSession, name: str, tenant_id: int | None = None) -> None:
    found = (await session.execute(select(Tenant).where(Tenant.name == name))).scalar_one_or_none()
    if found is not None and found.id != tenant_id:
        raise GatewayError(ErrorCode.CONFLICT, f"A tenant named '{name}' exists.", param="name")


async def create_tenant(svc: AdminService, actor: str, data: TenantIn) -> dict[str, Any]:
    if not data.name:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "A tenant needs a name.", param="name")
    async with svc.sessions() as session, session.begin():
        await _check_name_free(session, data.name)
        # Fields left out (None) take the column's default: weight 1, priority_floor 0, enabled.
        tenant = Tenant(**{k: v for k, v in msgspec.structs.asdict(data).items() if v is not None})
        session.add(tenant)
        await session.flush()
        after = row(tenant, TENANT_FIELDS)
        await AuditRepository(session).add(actor, "create", "tenant", str(tenant.id), None, after)
    await svc.config_changes.notify()
    return after


async def edit_tenant(
    svc: AdminService, actor: str, tenant_id: int, data: TenantIn, fields: set[str]
) -> dict[str, Any]:
    """Set exactly `fields` (those the admin sent) from `data`; None clears a nullable field
    (a limit, the allow-lists) and is refused for the others."""
    columns = Tenant.__table__.c
    changes = {f: getattr(data, f) for f in fields & set(TENANT_FIELDS) - {"id"}}
    for field, value in changes.items():
        if value is None and not columns[field].nullable:
            raise cannot_clear(field)
    async with svc.sessions() as session, session.begin():
        tenant = await get_or_404(session, Tenant, tenant_id)
        if changes.get("name") is not None:
            await _check_name_free(session, changes["name"], tenant_id)
        before = row(tenant, TENANT_FIELDS)
        for field, value in changes.items():
            setattr(tenant, field, value)
        await session.flush()
        after = row(tenant, TENANT_FIELDS)
        await AuditRepository(session).add(actor, "update", "tenant", str(tenant_id), before, after)
    svc.drop_cached_keys()  # limits and grants apply to the next request
    await svc.config_changes.notify()  # and on every other replica
    return after
