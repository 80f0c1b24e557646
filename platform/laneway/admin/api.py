"""The JSON admin API under /admin/api: login, tenants and keys, lanes and task policies,
model deployments, the audit log. Every change is audited (who, what, before/after) and
applied to the running gateway at once: API-key cache dropped, policy snapshot reloaded,
engines synced. Other replicas pick it up on their next poll.

Sessions: POST /admin/api/login sets an HttpOnly, SameSite=Strict cookie and returns a
CSRF token; every change must echo it in X-CSRF-Token.
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, patch, post, put
from litestar.datastructures import Cookie
from litestar.params import FromPath
from msgspec import Meta, Struct
from sqlalchemy import func, select

from laneway.admin import service
from laneway.admin.limits import KeyLimitsIn, tenant_usage
from laneway.admin.security import new_session_token, token_digest
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
from laneway.admin.throttle import LoginGuard
from laneway.admin.validation import Username, check_text, decode, decode_object, int_query
from laneway.api.openapi import ADMIN_CHANGE, ADMIN_SESSION
from laneway.core.auth import as_utc
from laneway.core.errors import GatewayError
from laneway.db.models import ApiKey, Tenant
from laneway.db.repositories import AdminRepository, AuditRepository, PolicyRepository

SESSION_COOKIE = "laneway_admin"
SESSION_TTL = timedelta(hours=12)


MAX_PAGE = 1_000_000
MAX_PER_PAGE = 200


class Login(Struct):
    username: Username
    password: Annotated[str, Meta(max_length=1024)]


def _decode(body: bytes, kind: type[Any]) -> Any:
    return decode(body, kind)


def _sent(body: bytes) -> set[str]:
    """The fields a PATCH/PUT names (an explicit null clears a field); the body must be an object."""
    return set(decode_object(body))


async def tenant_page(
    request: Request,  # type: ignore[type-arg]
    q: str,
    page: int,
    per_page: int,
) -> tuple[list[dict[str, Any]], int]:
    """One page of tenants whose name contains q, by name, and how many match in all."""
    async with request.app.state.sessions() as session:
        stmt = select(Tenant).where(Tenant.name.contains(q, autoescape=True)) if q else select(Tenant)
        total = (await session.execute(select(func.count()).select_from(stmt.subquery()))).scalar_one()
        rows = await session.execute(stmt.order_by(Tenant.name).offset((page - 1) * per_page).limit(per_page))
        return [row(t, TENANT_FIELDS) for t in rows.scalars()], int(total)


class AdminAPI(Controller):
    path = "/admin/api"

    # ---- sessions ----
    @post("/login", status_code=200)
    async def login(self, request: Request) -> Response[dict[str, str]]:  # type: ignore[type-arg]
        creds = _decode(await request.body(), Login)
        cookie, csrf = await open_session(request, creds.username, creds.password)
        return Response({"csrf_token": csrf, "username": creds.username}, cookies=[cookie])

    @post("/logout", status_code=200, security=ADMIN_CHANGE)
    async def logout(self, request: Request) -> Response[dict[str, str]]:  # type: ignore[type-arg]
        await _admin(request, change=True)
        async with request.app.state.sessions() as session, session.begin():
            await AdminRepository(session).close_session(token_digest(request.cookies[SESSION_COOKIE]))
        return Response({"status": "logged_out"}, cookies=[Cookie(key=SESSION_COOKIE, value="", path="/admin",
                                                                   max_age=0)])  # fmt: skip

    # ---- tenants and keys ----
    @get("/tenants", security=ADMIN_SESSION)
    async def tenants(self, request: Request) -> dict[str, Any]:  # type: ignore[type-arg]
        """?q= (name contains), ?page= (1..1000000), ?per_page= (1..200, default 50); out of range: 400."""
        await _admin(request)
        params = request.query_params
        q = check_text("q", params.get("q", ""), max_length=120, allow_empty=True)
        page = int_query("page", params.get("page"), default=1, lo=1, hi=MAX_PAGE)
        per_page = int_query("per_page", params.get("per_page"), default=50, lo=1, hi=MAX_PER_PAGE)
        data, total = await tenant_page(request, q, page, per_page)
        return {"data": data, "total": total, "page": page, "per_page": per_page}

    @post("/tenants", status_code=201, security=ADMIN_CHANGE)
    async def create_tenant(self, request: Request) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.create_tenant(request.app.state, actor, _decode(await request.body(), TenantIn))

    @patch("/tenants/{tenant_id:int}", security=ADMIN_CHANGE)
    async def edit_tenant(self, request: Request, tenant_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        body = await request.body()
        sent = _sent(body)  # explicit nulls clear a limit
        return await service.edit_tenant(request.app.state, actor, tenant_id, _decode(body, TenantIn), sent)

    @get("/tenants/{tenant_id:int}/keys", security=ADMIN_SESSION)
    async def keys(self, request: Request, tenant_id: FromPath[int]) -> list[dict[str, Any]]:  # type: ignore[type-arg]
        await _admin(request)
        async with request.app.state.sessions() as session:
            rows = await session.execute(select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id))
            return [row(k, KEY_FIELDS) for k in rows.scalars()]

    @post("/tenants/{tenant_id:int}/keys", status_code=201, security=ADMIN_CHANGE)
    async def issue(self, request: Request, tenant_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.issue_api_key(request.app.state, actor, tenant_id, _decode(await request.body(), KeyIn))

    @patch("/keys/{key_id:int}", security=ADMIN_CHANGE)
    async def edit_key(self, request: Request, key_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        """The key's own rpm, tpm, max_concurrency, allowed_models; null clears one."""
        actor = await _admin(request, change=True)
        body = await request.body()
        sent = _sent(body)
        return await service.edit_api_key(request.app.state, actor, key_id, _decode(body, KeyLimitsIn), sent)

    @get("/tenants/{tenant_id:int}/usage", security=ADMIN_SESSION)
    async def usage(self, request: Request, tenant_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        """Tokens used today and this month (UTC) next to the tenant's quotas, and when each resets."""
        await _admin(request)
        async with request.app.state.sessions() as session:
            tenant = await service.get_or_404(session, Tenant, tenant_id)
            return await tenant_usage(request.app.state.gateway.limiter, session, tenant)

    @delete("/keys/{key_id:int}", status_code=200, security=ADMIN_CHANGE)
    async def revoke(self, request: Request, key_id: FromPath[int]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.revoke_api_key(request.app.state, actor, key_id)

    # ---- policies ----
    @get("/lanes", security=ADMIN_SESSION)
    async def lanes(self, request: Request) -> list[dict[str, Any]]:  # type: ignore[type-arg]
        await _admin(request)
        async with request.app.state.sessions() as session:
            return [row(x, LANE_FIELDS) for x in await PolicyRepository(session).lanes()]

    @put("/lanes/{name:str}", security=ADMIN_CHANGE)
    async def put_lane(self, request: Request, name: FromPath[str]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        body = await request.body()
        sent = _sent(body)
        return await service.put_lane(request.app.state, actor, name, _decode(body, LaneIn), sent)

    @put("/tasks/{task:str}", security=ADMIN_CHANGE)
    async def put_task(self, request: Request, task: FromPath[str]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        body = await request.body()
        sent = _sent(body)
        return await service.put_task(request.app.state, actor, task, _decode(body, TaskIn), sent)

    # ---- models ----
    @put("/models/{alias:str}", security=ADMIN_CHANGE)
    async def put_model(self, request: Request, alias: FromPath[str]) -> dict[str, Any]:  # type: ignore[type-arg]
        actor = await _admin(request, change=True)
        return await service.put_model(request.app.state, actor, alias, _decode(await request.body(), ModelIn))

    @get("/audit", security=ADMIN_SESSION)
    async def audit(self, request: Request) -> list[dict[str, Any]]:  # type: ignore[type-arg]
        await _admin(request)
        limit = int_query("limit", request.query_params.get("limit"), default=100, lo=1, hi=1000)
        async with request.app.state.sessions() as session:
            rows = await AuditRepository(session).recent(limit)
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


# A refused login is answered this late. Refusing costs no hashing, but an attacker that
# sends its next guess as soon as it is answered would still make the loop parse hundreds of
# logins a second (measured: 570/s from 16 threads, the other tenants' p95 3.4x); held for a
# moment, each attacker connection is down to a few attempts a second. A sleeping handler
# costs no CPU, and the connection cap bounds how many there can be.
LOGIN_TARPIT_S = 0.25


async def tarpit() -> None:
    await asyncio.sleep(LOGIN_TARPIT_S)


def client_address(request: Request) -> str:  # type: ignore[type-arg]
    client = request.scope.get("client")
    return str(client[0]) if client else "unknown"


async def open_session(request: Request, username: str, password: str) -> tuple[Cookie, str]:  # type: ignore[type-arg]
    """Check the password and open a session: (the session cookie, its CSRF token).

    401 if wrong; 429 + Retry-After without any check when this address or username has
    failed too often (admin/throttle.py) or when too many checks are already pending. The
    argon2 check runs in the verifier's threads, never on the event loop; its outcome is
    counted even if the client hangs up before the answer."""
    check_text("username", username, max_length=120)
    guard: LoginGuard = request.app.state.login_guard
    try:
        attempt = guard.throttle.begin(username, client_address(request))
    except GatewayError:
        await tarpit()
        raise
    try:
        async with request.app.state.sessions() as session:
            admin = await AdminRepository(session).get_by_username(username)
            admin_id = admin.id if admin else None
        check = guard.verifier.submit(admin.password_hash if admin else None, password)
    except BaseException as exc:
        attempt.finish(None)
        if isinstance(exc, GatewayError) and exc.status == 429:  # login_busy
            await tarpit()
        raise

    def settle(done: asyncio.Future[bool]) -> None:
        ok = None if done.cancelled() or done.exception() else done.result() and admin_id is not None
        attempt.finish(ok)

    check.add_done_callback(settle)
    if not await asyncio.shield(check) or admin_id is None:
        raise GatewayError(401, "Wrong username or password.", code="invalid_credentials")
    token, digest, csrf = new_session_token()
    async with request.app.state.sessions() as session, session.begin():
        repo = AdminRepository(session)
        found = await repo.get_by_username(username)
        if found is None:  # deleted meanwhile
            raise GatewayError(401, "Wrong username or password.", code="invalid_credentials")
        await repo.open_session(found, digest, csrf, datetime.now(UTC) + SESSION_TTL)
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
