"""The JSON admin API under /admin/api: login, tenants and keys, lanes and task policies,
model deployments and fallbacks, batches, the audit log. Every change is audited (who, what, before/after) and
applied to the running gateway at once: API-key cache dropped, policy snapshot reloaded,
engines synced. Other replicas pick it up on their next poll.

Sessions: POST /admin/api/login sets an HttpOnly, SameSite=Strict cookie and returns a
CSRF token; every change must echo it in X-CSRF-Token.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, patch, post, put
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.params import FromPath
from msgspec import Meta, Struct
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.admin import batches, deployments, fallbacks, keys, policies, prices, replicas, tenants
from laneway.admin.dependencies import Limiter, Service
from laneway.admin.guards import PUBLIC, SESSION_COOKIE, AdminRequest
from laneway.admin.keys import KEY_FIELDS, KeyIn
from laneway.admin.limits import KeyLimitsIn, tenant_usage
from laneway.admin.openapi import ADMIN_CHANGE, ADMIN_SESSION
from laneway.admin.policies import LANE_FIELDS, LaneIn, LaneOrderIn, TaskIn
from laneway.admin.security import new_session_token, token_digest
from laneway.admin.service import AUDIT_FIELDS, get_or_404, row
from laneway.admin.tenants import TENANT_FIELDS, TenantIn
from laneway.admin.throttle import LoginGuard
from laneway.admin.validation import Username, check_text, decode, decode_object, int_query
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.key_pages import key_page
from laneway.db.models import Tenant
from laneway.db.repositories import AdminRepository, AuditRepository, PolicyRepository

SESSION_TTL = timedelta(hours=12)


MAX_PAGE = 1_000_000
MAX_PER_PAGE = 200


class Login(Struct):
    username: Username
    password: Annotated[str, Meta(max_length=1024)]


class ReplicaStateIn(Struct, forbid_unknown_fields=True):
    draining: bool | None = None
    enabled: bool | None = None


def _decode(body: bytes, kind: type[Any]) -> Any:
    return decode(body, kind)


def _sent(body: bytes) -> set[str]:
    """The fields a PATCH/PUT names (an explicit null clears a field); the body must be an object."""
    return set(decode_object(body))


async def tenant_page(
    sessions: async_sessionmaker[AsyncSession],
    q: str,
    page: int,
    per_page: int,
) -> tuple[list[dict[str, Any]], int]:
    """One page of tenants whose name contains q, by name, and how many match in all."""
    async with sessions() as session:
        stmt = select(Tenant).where(Tenant.name.contains(q, autoescape=True)) if q else select(Tenant)
        total = (await session.execute(select(func.count()).select_from(stmt.subquery()))).scalar_one()
        rows = await session.execute(stmt.order_by(Tenant.name).offset((page - 1) * per_page).limit(per_page))
        return [row(t, TENANT_FIELDS) for t in rows.scalars()], int(total)


class AdminAPI(Controller):
    """Behind the admin guards (admin/guards.py): a session for every route but the login,
    its CSRF token in X-CSRF-Token for every change."""

    path = "/admin/api"

    # ---- sessions ----
    @post("/login", status_code=200, opt=PUBLIC)
    async def login(self, request: Request, logins: NamedDependency[Logins]) -> Response[dict[str, str]]:  # type: ignore[type-arg]
        creds = _decode(await request.body(), Login)
        cookie, csrf = await open_session(request, logins, creds.username, creds.password)
        return Response({"csrf_token": csrf, "username": creds.username}, cookies=[cookie])

    @post("/logout", status_code=200, security=ADMIN_CHANGE)
    async def logout(self, request: AdminRequest, admin_service: Service) -> Response[dict[str, str]]:
        async with admin_service.sessions() as session, session.begin():
            await AdminRepository(session).close_session(token_digest(request.cookies[SESSION_COOKIE]))
        return Response(
            {"status": "logged_out"}, cookies=[Cookie(key=SESSION_COOKIE, value="", path="/admin", max_age=0)]
        )

    # ---- tenants and keys ----
    @get("/tenants", security=ADMIN_SESSION)
    async def tenants(self, request: AdminRequest, admin_service: Service) -> dict[str, Any]:
        """?q= (name contains), ?page= (1..1000000), ?per_page= (1..200, default 50); out of range: 400."""
        params = request.query_params
        q = check_text("q", params.get("q", ""), max_length=120, allow_empty=True)
        page = int_query("page", params.get("page"), default=1, lo=1, hi=MAX_PAGE)
        per_page = int_query("per_page", params.get("per_page"), default=50, lo=1, hi=MAX_PER_PAGE)
        data, total = await tenant_page(admin_service.sessions, q, page, per_page)
        return {"data": data, "total": total, "page": page, "per_page": per_page}

    @post("/tenants", status_code=201, security=ADMIN_CHANGE)
    async def create_tenant(self, request: AdminRequest, admin_service: Service) -> dict[str, Any]:
        data = _decode(await request.body(), TenantIn)
        return await tenants.create_tenant(admin_service, request.user.username, data)

    @patch("/tenants/{tenant_id:int}", security=ADMIN_CHANGE)
    async def edit_tenant(
        self, request: AdminRequest, admin_service: Service, tenant_id: FromPath[int]
    ) -> dict[str, Any]:
        body = await request.body()
        sent = _sent(body)  # explicit nulls clear a limit
        actor = request.user.username
        return await tenants.edit_tenant(admin_service, actor, tenant_id, _decode(body, TenantIn), sent)

    @get("/tenants/{tenant_id:int}/keys", security=ADMIN_SESSION)
    async def keys(self, request: AdminRequest, admin_service: Service, tenant_id: FromPath[int]) -> dict[str, Any]:
        """Cursor pages, as the Files API: ?q= (name or prefix contains), ?after= (the page
        before's last_id), ?limit= (1..200, default 50): {"object": "list", "data", "first_id",
        "last_id", "has_more"}, by id."""
        params = request.query_params
        q = check_text("q", params.get("q", ""), max_length=120, allow_empty=True)
        after = int_query("after", params.get("after"), default=0, lo=0, hi=2**31 - 1)
        limit = int_query("limit", params.get("limit"), default=50, lo=1, hi=MAX_PER_PAGE)
        async with admin_service.sessions() as session:
            await get_or_404(session, Tenant, tenant_id)
            found = await key_page(session, tenant_id, q=q, after=after or None, limit=limit + 1)
        page = [row(k, KEY_FIELDS) for k in found[:limit]]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(found) > limit,
        }

    @post("/tenants/{tenant_id:int}/keys", status_code=201, security=ADMIN_CHANGE)
    async def issue(self, request: AdminRequest, admin_service: Service, tenant_id: FromPath[int]) -> dict[str, Any]:
        data = _decode(await request.body(), KeyIn)
        return await keys.issue_api_key(admin_service, request.user.username, tenant_id, data)

    @patch("/keys/{key_id:int}", security=ADMIN_CHANGE)
    async def edit_key(self, request: AdminRequest, admin_service: Service, key_id: FromPath[int]) -> dict[str, Any]:
        """The key's own rpm, tpm, max_concurrency, allowed_models; null clears one."""
        body = await request.body()
        sent = _sent(body)
        actor = request.user.username
        return await keys.edit_api_key(admin_service, actor, key_id, _decode(body, KeyLimitsIn), sent)

    @get("/tenants/{tenant_id:int}/usage", security=ADMIN_SESSION)
    async def usage(self, admin_service: Service, limiter: Limiter, tenant_id: FromPath[int]) -> dict[str, Any]:
        """Tokens used today and this month (UTC) next to the tenant's quotas, and when each resets."""
        async with admin_service.sessions() as session:
            tenant = await get_or_404(session, Tenant, tenant_id)
            return await tenant_usage(limiter, session, tenant)

    @delete("/keys/{key_id:int}", status_code=200, security=ADMIN_CHANGE)
    async def revoke(self, request: AdminRequest, admin_service: Service, key_id: FromPath[int]) -> dict[str, Any]:
        return await keys.revoke_api_key(admin_service, request.user.username, key_id)

    # ---- policies ----
    @get("/lanes", security=ADMIN_SESSION)
    async def lanes(self, admin_service: Service) -> list[dict[str, Any]]:
        async with admin_service.sessions() as session:
            return [row(x, LANE_FIELDS) for x in await PolicyRepository(session).lanes()]

    @put("/lanes/{name:str}", security=ADMIN_CHANGE)
    async def put_lane(self, request: AdminRequest, admin_service: Service, name: FromPath[str]) -> dict[str, Any]:
        body = await request.body()
        sent = _sent(body)
        return await policies.put_lane(admin_service, request.user.username, name, _decode(body, LaneIn), sent)

    @delete("/lanes/{name:str}", status_code=200, security=ADMIN_CHANGE)
    async def delete_lane(self, request: AdminRequest, admin_service: Service, name: FromPath[str]) -> dict[str, Any]:
        """409 while a deployment is dedicated to the lane (its config lists it)."""
        return await policies.delete_lane(admin_service, request.user.username, name)

    @put("/lanes", security=ADMIN_CHANGE)
    async def order_lanes(self, request: AdminRequest, admin_service: Service) -> dict[str, Any]:
        """{"order": [every lane's name]}: the order their rules are tried in, saved at once."""
        data = _decode(await request.body(), LaneOrderIn)
        return {"order": await policies.set_lane_order(admin_service, request.user.username, data)}

    @delete("/tasks/{task:str}", status_code=200, security=ADMIN_CHANGE)
    async def delete_task(self, request: AdminRequest, admin_service: Service, task: FromPath[str]) -> dict[str, Any]:
        return await policies.delete_task(admin_service, request.user.username, task)

    @put("/tasks/{task:str}", security=ADMIN_CHANGE)
    async def put_task(self, request: AdminRequest, admin_service: Service, task: FromPath[str]) -> dict[str, Any]:
        body = await request.body()
        sent = _sent(body)
        return await policies.put_task(admin_service, request.user.username, task, _decode(body, TaskIn), sent)

    # ---- models ----
    @put("/models/{alias:str}", security=ADMIN_CHANGE)
    async def put_model(self, request: AdminRequest, admin_service: Service, alias: FromPath[str]) -> dict[str, Any]:
        data = _decode(await request.body(), deployments.ModelIn)
        return await deployments.put_model(admin_service, request.user.username, alias, data)

    @post("/models/{alias:str}/replicas", status_code=200, security=ADMIN_CHANGE)
    async def add_replica(self, request: AdminRequest, admin_service: Service, alias: FromPath[str]) -> dict[str, Any]:
        """One deployment more for the alias (made if new); started and warm before it serves."""
        data = _decode(await request.body(), deployments.DeploymentIn)
        return await deployments.add_replica(admin_service, request.user.username, alias, data)

    @put("/models/{alias:str}/replicas/{name:str}", security=ADMIN_CHANGE)
    async def swap_replica(
        self,
        request: AdminRequest,
        admin_service: Service,
        alias: FromPath[str],
        name: FromPath[str],
    ) -> dict[str, Any]:
        """Serve the replica by another engine: the new one warms up before the old one stops."""
        data = _decode(await request.body(), deployments.DeploymentIn)
        return await replicas.swap_replica(admin_service, request.user.username, alias, name, data)

    @patch("/models/{alias:str}/replicas/{name:str}", security=ADMIN_CHANGE)
    async def replica_state(
        self,
        request: AdminRequest,
        admin_service: Service,
        alias: FromPath[str],
        name: FromPath[str],
    ) -> dict[str, Any]:
        """{"draining": true|false} and/or {"enabled": true|false}."""
        data = _decode(await request.body(), ReplicaStateIn)
        actor, out = request.user.username, {"alias": alias, "name": name}
        if data.draining is not None:
            out |= await replicas.set_draining(admin_service, actor, alias, name, data.draining)
        if data.enabled is not None:
            out |= await replicas.set_enabled(admin_service, actor, alias, name, data.enabled)
        return out

    @delete("/models/{alias:str}/replicas/{name:str}", status_code=200, security=ADMIN_CHANGE)
    async def remove_replica(
        self,
        request: AdminRequest,
        admin_service: Service,
        alias: FromPath[str],
        name: FromPath[str],
    ) -> dict[str, Any]:
        return await deployments.remove_replica(admin_service, request.user.username, alias, name)

    @get("/models/{alias:str}/fallbacks", security=ADMIN_SESSION)
    async def model_fallbacks(self, admin_service: Service, alias: FromPath[str]) -> dict[str, Any]:
        return await fallbacks.get_fallbacks(admin_service, alias)

    @put("/models/{alias:str}/fallbacks", security=ADMIN_CHANGE)
    async def put_model_fallbacks(
        self, request: AdminRequest, admin_service: Service, alias: FromPath[str]
    ) -> dict[str, Any]:
        """{"fallbacks": ["b", "c"]}: the aliases that serve this one's requests when it cannot,
        in order; [] removes them. An unknown alias, one listed twice or a loop: 400."""
        data = _decode(await request.body(), fallbacks.FallbacksIn)
        return await fallbacks.set_fallbacks(admin_service, request.user.username, alias, data)

    @get("/models/{alias:str}/price", security=ADMIN_SESSION)
    async def model_price(self, admin_service: Service, alias: FromPath[str]) -> dict[str, Any]:
        return await prices.get_price(admin_service, alias)

    @put("/models/{alias:str}/price", security=ADMIN_CHANGE)
    async def put_model_price(
        self, request: AdminRequest, admin_service: Service, alias: FromPath[str]
    ) -> dict[str, Any]:
        """{"input": "0.15", "output": "0.60", "cached_input": "0.075"} per 1M tokens in the
        currency (LANEWAY_CURRENCY); input and output null: not priced. Applies to the next request."""
        data = _decode(await request.body(), prices.PriceIn)
        return await prices.set_price(admin_service, request.user.username, alias, data)

    # ---- batches ----
    @get("/batches", security=ADMIN_SESSION)
    async def batches(self, request: AdminRequest, admin_service: Service) -> dict[str, Any]:
        """?tenant= (its name; none: every tenant), ?after= (the page before's last_id), ?limit=
        (1..100, default 20): {"data", "has_more", "last_id"}, newest first."""
        return await batches.list_batches(admin_service, *batches.page_query(request.query_params))

    @post("/batches/{batch_id:str}/cancel", status_code=200, security=ADMIN_CHANGE)
    async def cancel_batch(
        self, request: AdminRequest, admin_service: Service, batch_id: FromPath[str]
    ) -> dict[str, Any]:
        """Any tenant's batch: cancelling (audited); 409 once it is finalizing or has ended."""
        return await batches.cancel_batch(admin_service, request.user.username, batch_id)

    @get("/audit", security=ADMIN_SESSION)
    async def audit(self, request: AdminRequest, admin_service: Service) -> list[dict[str, Any]]:
        limit = int_query("limit", request.query_params.get("limit"), default=100, lo=1, hi=1000)
        async with admin_service.sessions() as session:
            rows = await AuditRepository(session).recent(limit)
            return [row(e, AUDIT_FIELDS) for e in rows]


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


@dataclass(frozen=True)
class Logins:
    """What opening an admin session needs: the throttle and argon2 pool, the database, and
    the first start's password file (the login page points to it until someone logs in)."""

    guard: LoginGuard
    sessions: async_sessionmaker[AsyncSession]
    cookie_secure: bool
    password_file: Path


async def open_session(
    request: Request,  # type: ignore[type-arg]
    logins: Logins,
    username: str,
    password: str,
) -> tuple[Cookie, str]:
    """Check the password and open a session: (the session cookie, its CSRF token).

    401 if wrong; 429 + Retry-After without any check when this address or username has
    failed too often (admin/throttle.py) or when too many checks are already pending. The
    argon2 check runs in the verifier's threads, never on the event loop; its outcome is
    counted even if the client hangs up before the answer."""
    check_text("username", username, max_length=120)
    guard = logins.guard
    try:
        attempt = guard.throttle.begin(username, client_address(request))
    except GatewayError:
        await tarpit()
        raise
    try:
        async with logins.sessions() as session:
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
        raise GatewayError(ErrorCode.INVALID_CREDENTIALS, "Wrong username or password.")
    token, digest, csrf = new_session_token()
    async with logins.sessions() as session, session.begin():
        repo = AdminRepository(session)
        found = await repo.get_by_username(username)
        if found is None:  # deleted meanwhile
            raise GatewayError(ErrorCode.INVALID_CREDENTIALS, "Wrong username or password.")
        await repo.open_session(found, digest, csrf, datetime.now(UTC) + SESSION_TTL)
    cookie = Cookie(
        key=SESSION_COOKIE,
        value=token,
        path="/admin",
        httponly=True,
        samesite="strict",
        secure=logins.cookie_secure,
        max_age=int(SESSION_TTL.total_seconds()),
    )
    return cookie, csrf
