"""GET /admin/api/usage: any tenant's usage (or every tenant's) for machines, in the shape of
OpenAI's organization usage API (usage/report.py), read from the rollups. Behind the admin API's
guards (a session), registered next to AdminAPI."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get

from laneway.admin.dependencies import Service
from laneway.admin.guards import AdminRequest
from laneway.admin.openapi import ADMIN_SESSION
from laneway.admin.service import get_or_404
from laneway.db.models import Tenant
from laneway.usage.report import parse_query, query_params, tenant_of, usage_page


class UsageAPI(Controller):
    path = "/admin/api/usage"

    @get("/", security=ADMIN_SESSION)
    async def usage(self, request: AdminRequest, admin_service: Service) -> dict[str, Any]:
        """?start_time= (required) and ?end_time= (Unix seconds), ?bucket_width= (1m, 1h, 1d;
        default 1d), ?group_by= (model, key, lane; repeated or comma-separated), ?tenant_id=
        (none: every tenant), ?limit= (buckets a page), ?page= (the last answer's next_page)."""
        params = query_params(list(request.query_params.multi_items()))
        query = parse_query(params)
        tenant_id = tenant_of(params)
        async with admin_service.sessions() as session:
            if tenant_id is not None:
                await get_or_404(session, Tenant, tenant_id)
            return await usage_page(session, tenant_id, query)
