"""The admin page of batches (the Batches API, issue 25): every tenant's or one tenant's, newest
first, a page at a time, with each batch's status and progress; the table refreshed by htmx;
Cancel on a batch still validating or in progress. Everything goes through the admin service
(admin/batches.py): the same checks and audit row as the JSON API."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Template

from laneway.admin import batches
from laneway.admin.forms import form_of
from laneway.admin.guards import AdminRequest, NotLoggedIn
from laneway.admin.presentation import iso_utc
from laneway.admin.service import AdminService
from laneway.admin.ui import to_login
from laneway.contracts.errors import GatewayError

REFRESH_S = 5  # the table's poll: one page of batches and their item counts
PER_PAGE = 25


def list_url(tenant: str | None, after: str | None = None, *, panel: bool = False) -> str:
    query = urlencode({k: v for k, v in (("tenant", tenant), ("after", after)) if v})
    return "/admin/batches" + ("/panel" if panel else "") + (f"?{query}" if query else "")


def batch_rows(page: dict[str, Any]) -> list[dict[str, Any]]:
    """The API's batches with their times as the pages show them (UTC, to the second)."""
    return [
        {**b, **{k: iso_utc(datetime.fromisoformat(b[k])) for k in ("created_at", "expires_at")}} for b in page["data"]
    ]


class BatchPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin/batches"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    async def _panel(self, svc: AdminService, csrf: str, tenant: str | None, after: str | None) -> dict[str, Any]:
        page = await batches.list_batches(svc, tenant, after, PER_PAGE)
        return {
            "csrf": csrf,
            "tenant": tenant or "",
            "after": after or "",
            "batches": batch_rows(page),
            "next_url": list_url(tenant, page["last_id"]) if page["has_more"] else "",
            "panel_url": list_url(tenant, after, panel=True),
            "refresh_s": REFRESH_S,
        }

    async def _page(
        self,
        request: AdminRequest,
        svc: AdminService,
        tenant: str | None,
        after: str | None,
        *,
        status: int = 200,
        **extra: Any,
    ) -> Template:
        try:
            panel = await self._panel(svc, request.user.csrf, tenant, after)
        except GatewayError as exc:  # an unknown tenant, a stale cursor's odd text: every tenant's, and why
            panel = await self._panel(svc, request.user.csrf, None, None)
            extra["error"], status = exc.message, exc.status
        context = {"admin": request.user.username, "tenants": await batches.tenants_with_batches(svc), **panel, **extra}
        # After a cancel's POST the address bar shows the list (htmx), so a reload reads it again.
        headers = {"HX-Replace-Url": list_url(tenant, after)} if request.method == "POST" else {}
        return Template("batches.html", context=context, status_code=status, headers=headers)

    @get("/")
    async def batches_page(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Template:
        """?tenant= a tenant's name (none: every tenant's), ?after= the last batch of the page before."""
        params = request.query_params
        return await self._page(request, admin_service, params.get("tenant") or None, params.get("after") or None)

    @get("/panel")
    async def panel(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Template:
        """The table alone, for the page's htmx refresh."""
        params = request.query_params
        context = await self._panel(
            admin_service, request.user.csrf, params.get("tenant") or None, params.get("after") or None
        )
        return Template("batches_panel.html", context=context)

    @post("/{batch_id:str}/cancel")
    async def cancel(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], batch_id: FromPath[str]
    ) -> Template:
        """The form carries the list's filter (tenant, after): the page comes back as it was."""
        form = await form_of(request)
        tenant, after = form.get("tenant") or None, form.get("after") or None
        try:
            done = await batches.cancel_batch(admin_service, request.user.username, batch_id)
        except GatewayError as exc:  # gone, or ended meanwhile: said on the page, nothing changed
            return await self._page(request, admin_service, tenant, after, status=exc.status, error=exc.message)
        notice = (
            f"Batch {batch_id} of {done['tenant']} is {done['status']}: its pending requests are cancelled; "
            "those running finish."
        )
        return await self._page(request, admin_service, tenant, after, notice=notice)
