"""The admin web UI: server-rendered Jinja pages (admin-ui/templates), enhanced with htmx
(vendored in admin-ui/static, no CDN). It uses the same sessions, CSRF tokens and admin
operations (admin/service.py) as the JSON API; every form carries the session's CSRF token.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template
from sqlalchemy import func, select

from laneway.admin import service
from laneway.admin.api import SESSION_COOKIE, admin_session, check_csrf, open_session
from laneway.admin.service import KEY_FIELDS, TENANT_FIELDS, KeyIn, TenantIn, row
from laneway.core.errors import GatewayError
from laneway.db.models import ApiKey, Tenant

ADMIN_UI_DIR = Path(__file__).resolve().parents[3] / "admin-ui"
LOGIN_CSRF_COOKIE = "laneway_login_csrf"
PER_PAGE = 25

Page = Template | Redirect


def _to_login() -> Redirect:
    return Redirect("/admin/login", status_code=303)


async def _session(request: Request) -> tuple[str, str] | None:  # type: ignore[type-arg]
    try:
        return await admin_session(request)
    except GatewayError:
        return None


async def _form(request: Request) -> dict[str, str]:  # type: ignore[type-arg]
    return {k: str(v) for k, v in (await request.form()).items()}


def _tenant_input(form: dict[str, str]) -> tuple[TenantIn, set[str]]:
    """Form strings -> a validated TenantIn (empty number fields clear the limit)."""
    raw: dict[str, Any] = {}
    for field in ("weight", "rpm", "tpm", "max_concurrency"):
        if field in form:
            text = form[field].strip()
            raw[field] = None if text == "" else (float(text) if field == "weight" else int(text))
    if "name" in form:
        raw["name"] = form["name"].strip()
    if "allowed_models" in form:
        models = [m.strip() for m in form["allowed_models"].split(",") if m.strip()]
        raw["allowed_models"] = models or None
    if "csrf_token" in form and "name" not in form:  # the edit form: an unticked box is "not disabled"
        raw["disabled"] = form.get("disabled") == "true"
    return msgspec.convert(raw, TenantIn), set(raw)


class AdminUI(Controller):
    path = "/admin"
    include_in_schema = False

    @get("/")
    async def home(self, request: Request) -> Redirect:  # type: ignore[type-arg]
        return Redirect("/admin/tenants" if await _session(request) else "/admin/login", status_code=303)

    @get("/login")
    async def login_page(self, request: Request) -> Template:  # type: ignore[type-arg]
        token = secrets.token_urlsafe(24)
        cookie = Cookie(key=LOGIN_CSRF_COOKIE, value=token, path="/admin", httponly=True, samesite="strict")
        return Template("login.html", context={"login_csrf": token}, cookies=[cookie])

    @post("/login")
    async def login(self, request: Request) -> Page:  # type: ignore[type-arg]
        form = await _form(request)
        expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        try:
            check_csrf(form.get("csrf_token", ""), expected)
            cookie, _ = await open_session(request, form.get("username", ""), form.get("password", ""))
        except GatewayError as exc:
            return Template(
                "login.html", context={"login_csrf": expected, "error": exc.message}, status_code=exc.status
            )
        return Redirect("/admin/tenants", status_code=303, cookies=[cookie])

    @post("/logout")
    async def logout(self, request: Request) -> Redirect:  # type: ignore[type-arg]
        current = await _session(request)
        if current is not None:
            check_csrf((await _form(request)).get("csrf_token", ""), current[1])
            from laneway.admin.security import token_digest
            from laneway.db.repositories import AdminRepository

            async with request.app.state.sessions() as session, session.begin():
                await AdminRepository(session).close_session(token_digest(request.cookies[SESSION_COOKIE]))
        return Redirect(
            "/admin/login", status_code=303, cookies=[Cookie(key=SESSION_COOKIE, value="", path="/admin", max_age=0)]
        )

    @get("/tenants")
    async def tenants(self, request: Request, q: FromQuery[str] = "", page: FromQuery[int] = 1) -> Page:  # type: ignore[type-arg]
        current = await _session(request)
        if current is None:
            return _to_login()
        return await self._tenants_page(request, current, q=q, page=max(1, page))

    async def _tenants_page(
        self,
        request: Request,  # type: ignore[type-arg]
        current: tuple[str, str],
        *,
        q: str = "",
        page: int = 1,
        error: str = "",
        status: int = 200,
    ) -> Template:
        async with request.app.state.sessions() as session:
            stmt = select(Tenant).where(Tenant.name.contains(q)) if q else select(Tenant)
            total = (await session.execute(select(func.count()).select_from(stmt.subquery()))).scalar_one()
            rows = await session.execute(stmt.order_by(Tenant.name).offset((page - 1) * PER_PAGE).limit(PER_PAGE))
            tenants = [row(t, TENANT_FIELDS) for t in rows.scalars()]
        context = {"admin": current[0], "csrf": current[1], "tenants": tenants, "total": total, "q": q,
                   "page": page, "per_page": PER_PAGE, "error": error}  # fmt: skip
        return Template("tenants.html", context=context, status_code=status)

    @post("/tenants")
    async def create_tenant(self, request: Request) -> Page:  # type: ignore[type-arg]
        current = await _session(request)
        if current is None:
            return _to_login()
        form = await _form(request)
        check_csrf(form.get("csrf_token", ""), current[1])
        try:
            data, _ = _tenant_input(form)
            created = await service.create_tenant(request.app.state, current[0], data)
        except (GatewayError, msgspec.ValidationError, ValueError) as exc:
            message = exc.message if isinstance(exc, GatewayError) else f"Invalid value: {exc}"
            return await self._tenants_page(request, current, error=message, status=400)
        return Redirect(f"/admin/tenants/{created['id']}", status_code=303)

    async def _tenant_page(self, request: Request, current: tuple[str, str], tenant_id: int, **extra: Any) -> Template:  # type: ignore[type-arg]
        async with request.app.state.sessions() as session:
            tenant = await service.get_or_404(session, Tenant, tenant_id)
            keys = await session.execute(select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id))
            context = {"admin": current[0], "csrf": current[1], "tenant": row(tenant, TENANT_FIELDS),
                       "keys": [row(k, KEY_FIELDS) for k in keys.scalars()], **extra}  # fmt: skip
        return Template("tenant.html", context=context, status_code=400 if extra.get("error") else 200)

    @get("/tenants/{tenant_id:int}")
    async def tenant(self, request: Request, tenant_id: FromPath[int]) -> Page:  # type: ignore[type-arg]
        current = await _session(request)
        return _to_login() if current is None else await self._tenant_page(request, current, tenant_id)

    @post("/tenants/{tenant_id:int}")
    async def edit_tenant(self, request: Request, tenant_id: FromPath[int]) -> Page:  # type: ignore[type-arg]
        current = await _session(request)
        if current is None:
            return _to_login()
        form = await _form(request)
        check_csrf(form.get("csrf_token", ""), current[1])
        try:
            data, fields = _tenant_input(form)
            await service.edit_tenant(request.app.state, current[0], tenant_id, data, fields)
        except (msgspec.ValidationError, ValueError) as exc:
            return await self._tenant_page(request, current, tenant_id, error=f"Invalid value: {exc}")
        return await self._tenant_page(request, current, tenant_id, notice="Saved. The gateway applies it now.")

    @post("/tenants/{tenant_id:int}/keys")
    async def issue_key(self, request: Request, tenant_id: FromPath[int]) -> Page:  # type: ignore[type-arg]
        current = await _session(request)
        if current is None:
            return _to_login()
        form = await _form(request)
        check_csrf(form.get("csrf_token", ""), current[1])
        days = form.get("expires_days", "").strip()
        data = KeyIn(name=form.get("name", "default").strip() or "default", expires_days=float(days) if days else None)
        issued = await service.issue_api_key(request.app.state, current[0], tenant_id, data)
        return await self._tenant_page(request, current, tenant_id, secret=issued["secret"])

    @post("/keys/{key_id:int}/revoke")
    async def revoke_key(self, request: Request, key_id: FromPath[int]) -> Page:  # type: ignore[type-arg]
        current = await _session(request)
        if current is None:
            return _to_login()
        check_csrf((await _form(request)).get("csrf_token", ""), current[1])
        revoked = await service.revoke_api_key(request.app.state, current[0], key_id)
        return Redirect(f"/admin/tenants/{revoked['tenant_id']}", status_code=303)
