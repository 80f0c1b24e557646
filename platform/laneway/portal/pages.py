"""The portal's pages (admin-ui/templates/portal_*.html, the admin's look and static files):
log in, the tenant's keys (issue within the caps, revoke), its usage with limits and
refusals. Behind the portal's guards (portal/guards.py); the operations are portal/service.py's,
the same as the JSON API's."""

from __future__ import annotations

import secrets
from typing import Any

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template

from laneway.admin.api import Logins
from laneway.admin.dependencies import Limiter, Service
from laneway.admin.forms import form_of
from laneway.admin.guards import OPTIONAL, PUBLIC, NotLoggedIn, check_csrf
from laneway.admin.usage_ui import usage_charts
from laneway.admin.validation import convert
from laneway.contracts.errors import GatewayError
from laneway.core.prices import from_micros
from laneway.db.usage_stats import PERIODS
from laneway.portal import accounts, service
from laneway.portal.api import close_session, logged_out_cookie, usage_period
from laneway.portal.guards import PORTAL_COOKIE, MaybePortalRequest, PortalRequest

LOGIN_CSRF_COOKIE = "laneway_portal_login_csrf"
_NUMBERS = ("rpm", "tpm", "max_concurrency", "expires_days")


def to_login(_: Request, __: NotLoggedIn) -> Redirect:  # type: ignore[type-arg]
    return Redirect("/portal/login", status_code=303)


def key_input(form: dict[str, str]) -> service.PortalKeyIn:
    """Form strings -> a validated PortalKeyIn: empty fields are left out (the caps decide)."""
    raw: dict[str, Any] = {"name": form.get("name", "") or "default"}
    for field in _NUMBERS:
        if form.get(field, "").strip():
            raw[field] = form[field].strip()
    models = [m.strip() for m in form.get("allowed_models", "").split(",") if m.strip()]
    if models:
        raw["allowed_models"] = models
    return convert(raw, service.PortalKeyIn, strict=False)  # type: ignore[no-any-return]


class PortalPages(Controller):
    path = "/portal"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    @get("/", opt=OPTIONAL)
    async def home(self, request: MaybePortalRequest) -> Redirect:
        return Redirect("/portal/keys" if request.user is not None else "/portal/login", status_code=303)

    @get("/login", opt=PUBLIC)
    async def login_page(self) -> Template:
        token = secrets.token_urlsafe(24)
        cookie = Cookie(key=LOGIN_CSRF_COOKIE, value=token, path="/portal", httponly=True, samesite="strict")
        return Template("portal_login.html", context={"login_csrf": token}, cookies=[cookie])

    @post("/login", opt=PUBLIC)
    async def login(self, request: Request, logins: NamedDependency[Logins]) -> Template | Redirect:  # type: ignore[type-arg]
        form = await form_of(request)
        expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        try:
            check_csrf(form.get("csrf_token", ""), expected)
            username, password = form.get("username", ""), form.get("password", "")
            cookie, _ = await accounts.open_portal_session(request, logins, username, password)
        except GatewayError as exc:
            context = {"login_csrf": expected, "error": exc.message}
            return Template("portal_login.html", context=context, status_code=exc.status, headers=exc.headers)
        return Redirect("/portal/keys", status_code=303, cookies=[cookie])

    @post("/logout", opt=OPTIONAL)
    async def logout(self, request: MaybePortalRequest, admin_service: Service) -> Redirect:
        if request.user is not None:
            await close_session(admin_service, request.cookies[PORTAL_COOKIE])
        return Redirect("/portal/login", status_code=303, cookies=[logged_out_cookie()])

    async def _keys_page(self, request: PortalRequest, svc: Any, **extra: Any) -> Template:
        user, status = request.user, extra.pop("status", 200)
        page = await service.list_keys(svc, user.tenant_id, after=None, limit=service.MAX_KEYS_PAGE)
        caps = await service.get_caps(svc, user.tenant_id)
        context = {"user": user, "csrf": user.csrf, "section": "keys", "keys": page["data"], "caps": caps, **extra}
        return Template("portal_keys.html", context=context, status_code=status)

    @get("/keys")
    async def keys(self, request: PortalRequest, admin_service: Service) -> Template:
        return await self._keys_page(request, admin_service)

    @post("/keys")
    async def create_key(self, request: PortalRequest, admin_service: Service) -> Template:
        form = await form_of(request)
        try:
            data = key_input(form)
            created = await service.create_key(admin_service, request.user.actor, request.user.tenant_id, data)
        except GatewayError as exc:
            return await self._keys_page(request, admin_service, error=exc.message, form=form, status=exc.status)
        return await self._keys_page(request, admin_service, secret=created["key"], created=created)

    @post("/keys/{key_id:int}/revoke")
    async def revoke_key(self, request: PortalRequest, admin_service: Service, key_id: FromPath[int]) -> Template:
        revoked = await service.revoke_key(admin_service, request.user.actor, request.user.tenant_id, key_id)
        return await self._keys_page(request, admin_service, notice=f"Revoked key {revoked['name']}.")

    @get("/usage")
    async def usage(self, request: PortalRequest, admin_service: Service, limiter: Limiter) -> Template:
        user = request.user
        period = usage_period(request.query_params.get("period"))
        summary = await service.usage_summary(admin_service, user.tenant_id, period)
        usage = await service.usage(admin_service, user.tenant_id, period, summary)
        context = {
            "user": user,
            "csrf": user.csrf,
            "section": "usage",
            "period": period,
            "periods": list(PERIODS.values()),
            "summary": summary,
            "usage": usage,
            "charts": usage_charts(summary),
            "limits": await service.limits(admin_service, limiter, user.tenant_id),
            "refusals": await service.refusals(admin_service, user.tenant_id),
            "money": lambda micros: f"{from_micros(micros)} {admin_service.currency}",
        }
        return Template("portal_usage.html", context=context)
