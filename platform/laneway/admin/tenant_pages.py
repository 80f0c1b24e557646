"""The admin pages for tenants and their API keys: the list (search, pages), one tenant (its
limits, keys and quota usage), and the forms that create, edit, issue and revoke."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Controller, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, SkipValidation
from litestar.response import Redirect, Template

from laneway.admin import keys, tenants
from laneway.admin.api import MAX_PAGE, MAX_PER_PAGE, tenant_page
from laneway.admin.dependencies import Limiter
from laneway.admin.forms import form_of, key_limits_input, page_number, tenant_input
from laneway.admin.guards import AdminRequest, AdminSession, NotLoggedIn
from laneway.admin.keys import KEY_FIELDS, KeyIn
from laneway.admin.limits import KeyLimitsIn, tenant_usage
from laneway.admin.presentation import LIMIT_FIELDS, field_message, typed_tenant
from laneway.admin.service import AdminService, get_or_404, row
from laneway.admin.tenants import TENANT_FIELDS
from laneway.admin.ui import Page, to_login
from laneway.admin.validation import check_text, convert, int_query
from laneway.contracts.errors import GatewayError
from laneway.core.ratelimit import RateLimiter
from laneway.db.key_pages import key_page
from laneway.db.models import ApiKey, Tenant

PER_PAGE = 25
KEYS_PER_PAGE = 50  # a tenant's keys a page: 100,000 keys are 2,000 pages, never one


@dataclass(frozen=True)
class TenantView:
    """What a tenant's page reads: the admin service and the limiter (its quota usage)."""

    svc: AdminService
    limiter: RateLimiter


def tenant_view(admin_service: NamedDependency[AdminService], limiter: Limiter) -> TenantView:
    return TenantView(admin_service, limiter)


class TenantPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}
    dependencies = {"view": Provide(tenant_view, sync_to_thread=False)}

    @get("/tenants")
    async def tenants(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        """?q= and ?page= (clamped: below 1 is 1, past the end is the last page); ?per_page=
        (1..200) and a q with control characters re-render the list with the error and 400."""
        params = request.query_params
        try:
            q = check_text("q", params.get("q", ""), max_length=120, allow_empty=True)
            per_page = int_query("per_page", params.get("per_page"), default=PER_PAGE, lo=1, hi=MAX_PER_PAGE)
        except GatewayError as exc:
            return await self._tenants_page(admin_service, request.user, list_error=exc.message, status=400)
        page = page_number(params.get("page"))
        return await self._tenants_page(admin_service, request.user, q=q, page=page, per_page=per_page)

    async def _tenants_page(
        self,
        svc: AdminService,
        current: AdminSession,
        *,
        q: str = "",
        page: int = 1,
        per_page: int = PER_PAGE,
        error: str = "",
        list_error: str = "",
        status: int = 200,
        error_field: str | None = None,
        typed: dict[str, str] | None = None,
    ) -> Template:
        page = min(page, MAX_PAGE)
        found, total = await tenant_page(svc.sessions, q, page, per_page)
        last = max(1, -(-total // per_page))
        if page > last:
            page = last
            found, total = await tenant_page(svc.sessions, q, page, per_page)
        context = {
            "admin": current.username,
            "csrf": current.csrf,
            "tenants": found,
            "total": total,
            "q": q,
            "page": page,
            "per_page": per_page,
            "error": error,
            "list_error": list_error,
        }
        # A rejected create form comes back as typed, its message next to the field.
        context |= {"typed": typed or {}, "error_field": error_field, "limit_fields": LIMIT_FIELDS}
        return Template("tenants.html", context=context, status_code=status)

    @post("/tenants")
    async def create_tenant(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        form = await form_of(request)
        try:
            data, _ = tenant_input(form)
            created = await tenants.create_tenant(admin_service, request.user.username, data)
        except GatewayError as exc:
            return await self._tenants_page(
                admin_service,
                request.user,
                error=field_message(exc.param, exc.message),
                status=exc.status,
                error_field=exc.param,
                typed=form,
            )
        return Redirect(f"/admin/tenants/{created['id']}", status_code=303)

    async def _tenant_page(
        self,
        view: TenantView,
        current: AdminSession,
        tenant_id: int,
        status: int | None = None,
        **extra: Any,
    ) -> Template:
        svc, limiter = view.svc, view.limiter
        async with svc.sessions() as session:
            tenant = await get_or_404(session, Tenant, tenant_id)
            keys_q, keys_after = extra.pop("keys_q", ""), extra.pop("keys_after", None)
            found = await key_page(session, tenant_id, q=keys_q, after=keys_after, limit=KEYS_PER_PAGE + 1)
            context = {
                "admin": current.username,
                "csrf": current.csrf,
                "tenant": row(tenant, TENANT_FIELDS),
                "keys": [row(k, KEY_FIELDS) for k in found[:KEYS_PER_PAGE]],
                "keys_q": keys_q,
                "keys_after": keys_after,
                "keys_more": len(found) > KEYS_PER_PAGE,
                "usage": await tenant_usage(limiter, session, tenant),
                **extra,
            }
        context["limit_fields"] = LIMIT_FIELDS
        if extra.get("typed"):  # a rejected edit: show what was typed, not the stored values
            context["tenant"] = typed_tenant(context["tenant"], extra["typed"])
        failed = extra.get("error") or extra.get("key_error") or extra.get("key_errors")
        return Template("tenant.html", context=context, status_code=status or (400 if failed else 200))

    @get("/tenants/{tenant_id:int}")
    async def tenant(
        self,
        request: AdminRequest,
        view: SkipValidation[TenantView],
        tenant_id: FromPath[int],
    ) -> Page:
        """?keys_q= (a key's name or prefix contains) and ?keys_after= (the last key id shown):
        the keys come KEYS_PER_PAGE at a time, searched in the database."""
        params = request.query_params
        try:
            keys_q = check_text("keys_q", params.get("keys_q", ""), max_length=120, allow_empty=True)
            after = int_query("keys_after", params.get("keys_after"), default=0, lo=0, hi=2**31 - 1)
        except GatewayError as exc:
            return await self._tenant_page(view, request.user, tenant_id, key_error=exc.message, status=400)
        return await self._tenant_page(view, request.user, tenant_id, keys_q=keys_q, keys_after=after or None)

    @post("/tenants/{tenant_id:int}")
    async def edit_tenant(
        self,
        request: AdminRequest,
        view: SkipValidation[TenantView],
        tenant_id: FromPath[int],
    ) -> Page:
        current, form = request.user, await form_of(request)
        try:
            data, fields = tenant_input(form)
            await tenants.edit_tenant(view.svc, current.username, tenant_id, data, fields)
        except GatewayError as exc:
            if exc.status == 404:
                raise
            return await self._tenant_page(
                view,
                current,
                tenant_id,
                error=field_message(exc.param, exc.message),
                status=exc.status,
                error_field=exc.param,
                typed=form,
            )
        return await self._tenant_page(view, current, tenant_id, notice="Saved. The gateway applies it now.")

    @post("/tenants/{tenant_id:int}/keys")
    async def issue_key(
        self,
        request: AdminRequest,
        view: SkipValidation[TenantView],
        tenant_id: FromPath[int],
    ) -> Page:
        current, form = request.user, await form_of(request)
        raw = {
            "name": form.get("name", "default").strip() or "default",
            "expires_days": form.get("expires_days", "").strip() or None,
            **key_limits_input(form),
        }
        try:
            data = convert(raw, KeyIn, strict=False)
            issued = await keys.issue_api_key(view.svc, current.username, tenant_id, data)
        except GatewayError as exc:
            if exc.status == 404:
                raise
            return await self._tenant_page(view, current, tenant_id, key_error=exc.message, status=exc.status)
        return await self._tenant_page(view, current, tenant_id, secret=issued["secret"])

    @post("/keys/{key_id:int}/limits")
    async def edit_key_limits(
        self,
        request: AdminRequest,
        view: SkipValidation[TenantView],
        key_id: FromPath[int],
    ) -> Page:
        """The key row's form: its own rpm, tpm, max concurrency and models (empty: the tenant's)."""
        current, form = request.user, await form_of(request)
        async with view.svc.sessions() as session:
            tenant_id = (await get_or_404(session, ApiKey, key_id)).tenant_id
        raw = key_limits_input(form)
        try:
            await keys.edit_api_key(
                view.svc, current.username, key_id, convert(raw, KeyLimitsIn, strict=False), set(raw)
            )
        except GatewayError as exc:  # shown on the key's row
            return await self._tenant_page(
                view, current, tenant_id, key_errors={key_id: exc.message}, status=exc.status
            )
        return await self._tenant_page(
            view, current, tenant_id, notice="Saved the key's limits. The gateway applies them now."
        )

    @post("/keys/{key_id:int}/revoke")
    async def revoke_key(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], key_id: FromPath[int]
    ) -> Page:
        revoked = await keys.revoke_api_key(admin_service, request.user.username, key_id)
        return Redirect(f"/admin/tenants/{revoked['tenant_id']}", status_code=303)
