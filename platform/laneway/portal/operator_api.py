"""The operator's side of a tenant's portal, in the JSON admin API (behind the admin's guards
and role rules, admin/roles.py): its portal users and the caps on the keys they may issue."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import Controller, get, post, put
from litestar.params import FromPath

from laneway.admin.dependencies import Service
from laneway.admin.guards import AdminRequest
from laneway.admin.openapi import ADMIN_CHANGE, ADMIN_SESSION
from laneway.admin.service import get_or_404
from laneway.admin.validation import decode
from laneway.db.models import Tenant
from laneway.db.portal_repositories import key_caps
from laneway.db.portal_tables import PortalKeyCaps
from laneway.db.repositories import AuditRepository
from laneway.portal import accounts, service


class PortalOperatorAPI(Controller):
    path = "/admin/api/tenants/{tenant_id:int}/portal"

    @get("/", security=ADMIN_SESSION)
    async def portal(self, admin_service: Service, tenant_id: FromPath[int]) -> dict[str, Any]:
        """The tenant's portal users and key caps."""
        caps = await service.get_caps(admin_service, tenant_id)
        return {"caps": caps, "users": await accounts.portal_users(admin_service, tenant_id)}

    @put("/caps", security=ADMIN_CHANGE)
    async def set_caps(self, request: AdminRequest, admin_service: Service, tenant_id: FromPath[int]) -> dict[str, Any]:
        """{"max_keys", "allowed_models", "max_rpm", "max_tpm", "max_concurrency"}: what the
        tenant's portal users may issue; the keys already issued keep their limits."""
        data = decode(await request.body(), service.CapsIn)
        async with admin_service.sessions() as session, session.begin():
            await get_or_404(session, Tenant, tenant_id)
            found = await key_caps(session, tenant_id)
            before = service.caps_of(found) if found is not None else None
            if found is None:
                found = PortalKeyCaps(tenant_id=tenant_id)
                session.add(found)
            for field in service.CAP_FIELDS:
                setattr(found, field, getattr(data, field))
            found.updated_at = datetime.now(UTC)
            after = service.caps_of(found)
            await AuditRepository(session).add(
                request.user.username, "update", "portal_caps", str(tenant_id), before, after
            )
        return after

    @post("/users", status_code=201, security=ADMIN_CHANGE)
    async def invite(self, request: AdminRequest, admin_service: Service, tenant_id: FromPath[int]) -> dict[str, Any]:
        """{"username", "password", "role": "tenant-owner" | "tenant-member"}."""
        data = decode(await request.body(), accounts.PortalUserIn)
        actor = request.user.username
        return await accounts.create_portal_user(
            admin_service, actor, tenant_id, data.username, data.password, data.role
        )
