"""Admin operations on batches (the Batches API, issue 25): every tenant's batches or one
tenant's, newest first, with the tenant's name and the batch's progress; cancel any tenant's
batch, audited in the cancel's own transaction. The store is the one the API uses
(db/batch_store.py), read with no tenant: an admin's view. The runner reads the batch's status
from the database, so a cancel needs no NOTIFY: pending items are cancelled at once, running
ones finish."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.admin.service import AdminService
from laneway.admin.validation import check_text, int_query
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.batch_records import CANCELLED, CANCELLING, IN_PROGRESS, VALIDATING, BatchInfo
from laneway.db.batch_store import BatchStore
from laneway.db.batch_tables import Batch
from laneway.db.models import Tenant
from laneway.db.repositories import AuditRepository, TenantRepository

DEFAULT_LIMIT, MAX_LIMIT = 20, 100  # a page, as the /v1 list's
CANCELLABLE = (VALIDATING, IN_PROGRESS)
STAMPS = (
    "created_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "expires_at",
)


def shown(batch: BatchInfo, tenant: str) -> dict[str, Any]:
    """A batch as an admin sees it: `done` is completed + failed out of `total` (cancelled
    items count in neither); `cancellable` while it is validating or in progress."""
    stamps: dict[str, str | None] = {}
    for name in STAMPS:
        value: datetime | None = getattr(batch, name)
        stamps[name] = None if value is None else value.isoformat()
    return {
        "id": batch.id,
        "tenant_id": batch.tenant_id,
        "tenant": tenant,
        "status": batch.status,
        "endpoint": batch.endpoint,
        "input_file_id": batch.input_file_id,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "metadata": batch.metadata,
        "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
        "done": batch.completed + batch.failed,
        "cancellable": batch.status in CANCELLABLE,
        **stamps,
    }


def page_query(params: Mapping[str, str]) -> tuple[str | None, str | None, int]:
    """?tenant= (a tenant's name; empty: every tenant), ?after= (the last id of the page
    before), ?limit= (1..100, default 20); a bad one: 400 naming it."""
    tenant = check_text("tenant", params.get("tenant", ""), max_length=120, allow_empty=True) or None
    after = check_text("after", params.get("after", ""), max_length=100, allow_empty=True) or None
    limit = int_query("limit", params.get("limit"), default=DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT)
    return tenant, after, limit


async def _tenant_id(session: AsyncSession, name: str) -> int:
    found = await TenantRepository(session).get_by_name(name)
    if found is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No tenant named '{name}'.", param="tenant")
    return int(found.id)


async def _tenant_names(session: AsyncSession, ids: set[int]) -> dict[int, str]:
    rows = await session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids)))
    return {int(tenant_id): str(name) for tenant_id, name in rows.all()}


async def list_batches(
    svc: AdminService, tenant: str | None = None, after: str | None = None, limit: int = DEFAULT_LIMIT
) -> dict[str, Any]:
    """A page of batches, newest first: {"data", "has_more", "last_id"}; the next page is
    `after=last_id`. An unknown tenant: 404."""
    check_text("after", after or "", max_length=100, allow_empty=True)
    if not 1 <= limit <= MAX_LIMIT:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST, f"limit must be a whole number from 1 to {MAX_LIMIT}.", param="limit"
        )
    tenant_id = None
    if tenant is not None:
        async with svc.sessions() as session:
            tenant_id = await _tenant_id(session, check_text("tenant", tenant, max_length=120))
    found = await BatchStore(svc.sessions).list_batches(tenant_id, after=after, limit=limit + 1)
    page = found[:limit]
    async with svc.sessions() as session:
        names = await _tenant_names(session, {b.tenant_id for b in page})
    data = [shown(b, names.get(b.tenant_id, f"#{b.tenant_id}")) for b in page]
    return {"data": data, "has_more": len(found) > limit, "last_id": page[-1].id if page else None}


async def tenants_with_batches(svc: AdminService) -> list[str]:
    """The names of the tenants that have a batch, by name: the page's tenant filter."""
    async with svc.sessions() as session:
        owners = select(Batch.tenant_id).distinct()
        rows = await session.execute(select(Tenant.name).where(Tenant.id.in_(owners)).order_by(Tenant.name))
        return [str(name) for name in rows.scalars()]


async def cancel_batch(svc: AdminService, actor: str, batch_id: str) -> dict[str, Any]:
    """Cancel any tenant's batch: cancelling, its pending requests cancelled at once, those
    running finish. Audited (`cancel batch ID`, the status before and after) in the cancel's
    transaction. Already cancelling or cancelled: the batch as it is, nothing audited; in
    another status (finalizing, or ended): 409; an unknown id: 404."""
    check_text("batch_id", batch_id, max_length=100)
    store = BatchStore(svc.sessions)
    before = await store.get_batch(None, batch_id)
    if before is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No batch with id {batch_id}.", param="batch_id")

    async def audit(session: AsyncSession, after: BatchInfo) -> None:
        await AuditRepository(session).add(
            actor, "cancel", "batch", batch_id, {"status": before.status}, {"status": after.status}
        )

    after = await store.cancel(None, batch_id, on_cancelled=audit)
    if after is None:  # deleted meanwhile
        raise GatewayError(ErrorCode.NOT_FOUND, f"No batch with id {batch_id}.", param="batch_id")
    if after.status not in (CANCELLING, CANCELLED):
        raise GatewayError(
            ErrorCode.CONFLICT,
            f"Batch {batch_id} is {after.status}: only a validating or in-progress batch can be cancelled.",
            param="batch_id",
        )
    async with svc.sessions() as session:
        names = await _tenant_names(session, {after.tenant_id})
    return shown(after, names.get(after.tenant_id, f"#{after.tenant_id}"))
