"""The JSON admin API under /admin/api: login, tenants and keys, lanes and task policies,
model deployments, the audit log. Every change is audited (who, what, before/after) and
applied to the running gateway at once: API-key cache dropped, policy snapshot reloaded,
engines synced. Other replicas pick it up on their next poll.

Sessions: POST /admin/api/login sets an HttpOnly, SameSite=Strict cookie and returns a
CSRF token; every change must echo it in X-CSRF-Token.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, patch, post, put
from litestar.datastructures import Cookie
from litestar.params import FromPath, FromQuery
from msgspec import Struct
from sqlalchemy import func, select

from laneway.admin import service
from laneway.admin.security import new_session_token, token_digest, verify_password
from laneway.admin.service import (
    AUDIT_FIELDS,
    KEY_FIELDS,
    LANE_FIELDS,
    TENANT_FIELDS,
    KeyIn,
    LaneIn,
    ModelIn,
    TaskIn,
    TenantIn,
    row,
)
from laneway.api.errors import validation_error
from laneway.core.auth import as_utc
from laneway.core.errors import GatewayError
from laneway.db.models import ApiKey, Tenant
from laneway.db.repositories import AdminRepository, AuditRepository, PolicyRepository

SESSION_COOKIE = "laneway_admin"
SESSION_TTL = timedelta(hours=12)


class Login(Struct):
    username: str
    password: str


def _decode(body: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(body or b"{}", type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise validation_error(exc) from None


class AdminAPI(Controller):
    path = "/admin/api"

    # ---- sessions ----
    @post("/login", status_code=200)
    async def login(self, request: Request) -> Response[dict[str, str]]:  # type: ignore[type-arg]
        creds = _decode(await request.body(), Login)
        cookie, csrf = await open_session(request, creds.username, creds.password)
        return Response({"csrf_token": csrf, "username": creds.username}, cookies=[cookie])

    @post("/logout", status_code=200)
    async def logout(self, request: Request) -> Response[dict[str, str]]:  # type: ignore[type-arg]
        await _admin(request, change=True)
        async with request.app.state.sessions() as session, session.begin():
            await AdminRepository(session).close_session(token_digest(request.cookies[SESSION_COOKIE]))
        return Response({"status": "logged_out"}, cookies=[Cookie(key=SESSION_COOKIE, value="", path="/admin",
                                                                   max_age=0)])  # fmt: skip

    # ---- tenants and keys ----
    @get("/tenants")
    async def tenants(
        self,
        request: Request,  # type: ignore[type-arg]
        q: FromQuery[str] = "",
        page: FromQuery[int] = 1,
        per_page: FromQuery[int] = 50,
    ) -> dict[str, Any]:
        await _admin(request)
        per_page = max(1, min(per_page, 200))
        async with request.app.state.sessions() as session:
            stmt = select(Tenant).where(Tenant.name.contains(q)) if q else select(Tenant)
            total = (await session.execute(select(func.count()).select_from(stmt.subquery()))).scalar_one()
            rows = await session.execute(stmt.order_by(Tenant.name).offset((page - 1) * per_page).limit(per_page))
            return {"data": [row(t, TENANT_FIELDS) for t in rows.scalars()], "total": total, "page": page}

    @post("/tenants", status_code=201)
    async def create_tenant(self, request: Request) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.create_tenant(request.app.state, actor, _decode(await request.body(), TenantIn))

    @patch("/tenants/{tenant_id:int}")
    async def edit_tenant(self, request: Request, tenant_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        body = await request.body()
        sent = set(msgspec.json.decode(body or b"{}"))  # explicit nulls clear a limit
        return await service.edit_tenant(request.app.state, actor, tenant_id, _decode(body, TenantIn), sent)

    @get("/tenants/{tenant_id:int}/keys")
    async def keys(self, request: Request, tenant_id: FromPath[int]) -> list[dict[str, Any]]:  # type: ignore[type-arg]
        await _admin(request)
        async with request.app.state.sessions() as session:
            rows = await session.execute(select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id))
            return [row(k, KEY_FIELDS) for k in rows.scalars()]

    @post("/tenants/{tenant_id:int}/keys", status_code=201)
    async def issue(self, request: Request, tenant_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.issue_api_key(request.app.state, actor, tenant_id, _decode(await request.body(), KeyIn))

    @delete("/keys/{key_id:int}", status_code=200)
    async def revoke(self, request: Request, key_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.revoke_api_key(request.app.state, actor, key_id)

    # ---- policies ----
    @get("/lanes")
    async def lanes(self, request: Request) -> list[dict[str, Any]]:  # type: ignore[type-arg]
        await _admin(request)
        async with request.app.state.sessions() as session:
            return [row(x, LANE_FIELDS) for x in await PolicyRepository(session).lanes()]

    @put("/lanes/{name:str}")
    async def put_lane(self, request: Request, name: FromPath[str]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.put_lane(request.app.state, actor, name, _decode(await request.body(), LaneIn))

    @put("/tasks/{task:str}")
    async def put_task(self, request: Request, task: FromPath[str]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.put_task(request.app.state, actor, task, _decode(await request.body(), TaskIn))

    # ---- models ----
    @put("/models/{alias:str}")
    async def put_model(self, request: Request, alias: FromPath[str]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.put_model(request.app.state, actor, alias, _decode(await request.body(), ModelIn))

    @get("/audit")
    async def audit(self, request: Request, limit: FromQuery[int] = 100) -> list[dict[str, Any]]:  # type: ignore[type-arg]
        await _admin(request)
        async with request.app.state.sessions() as session:
            rows = await AuditRepository(session).recent(max(1, min(limit, 1000)))
            return [row(e, AUDIT_FIELDS) for e in rows]


async def _admin(request: Request, *, change: bool = False) -> str:  # type: ignore[type-arg]
    """The logged-in admin's name; for a change, the request must carry the session's CSRF
    token in X-CSRF-Token."""
    username, csrf = await admin_session(request)
    if change:
        check_csrf(request.headers.get("x-csrf-token", ""), csrf)
    return username


async def admin_session(request: Request) -> tuple[str, str]:  # type: ignore[type-arg]
    """(admin name, the session's CSRF token) from the session cookie; 401 without one."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise GatewayError(401, "Log in first.", code="not_logged_in")
    async with request.app.state.sessions() as session:
        found = await AdminRepository(session).find_session(token_digest(token))
        if found is None or as_utc(found.expires_at) <= datetime.now(UTC):
            raise GatewayError(401, "Your admin session has expired; log in again.", code="not_logged_in")
        return str(found.admin.username), found.csrf_token


def check_csrf(given: str, expected: str) -> None:
    if not given or not secrets.compare_digest(given, expected):
        raise GatewayError(403, "Missing or wrong CSRF token.", code="csrf_failed")


async def open_session(request: Request, username: str, password: str) -> tuple[Cookie, str]:  # type: ignore[type-arg]
    """Check the password and open a session: (the session cookie, its CSRF token); 401 if wrong."""
    token, digest, csrf = new_session_token()
    async with request.app.state.sessions() as session, session.begin():
        repo = AdminRepository(session)
        admin = await repo.get_by_username(username)
        if not verify_password(admin.password_hash if admin else None, password) or admin is None:
            raise GatewayError(401, "Wrong username or password.", code="invalid_credentials")
        await repo.open_session(admin, digest, csrf, datetime.now(UTC) + SESSION_TTL)
    cookie = Cookie(
        key=SESSION_COOKIE,
        value=token,
        path="/admin",
        httponly=True,
        samesite="strict",
        secure=request.app.state.settings.admin_cookie_secure,
        max_age=int(SESSION_TTL.total_seconds()),
    )
    return cookie, csrf
