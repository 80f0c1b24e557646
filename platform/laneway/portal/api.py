"""The portal's JSON API under /portal/api, beside its pages: a tenant's own users log in, list,
create and revoke the tenant's keys, and read its usage, limits and refusals. Every route but
the login is behind the portal's guards (portal/guards.py): the session, the CSRF token of a
change in X-CSRF-Token, the role's rule. The tenant is always the session's."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Stream
from msgspec import Meta, Struct

from laneway.admin.api import Logins
from laneway.admin.dependencies import Limiter, Service
from laneway.admin.guards import PUBLIC
from laneway.admin.security import token_digest
from laneway.admin.usage_ui import csv_chunks
from laneway.admin.validation import Username, decode, int_query
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.portal_repositories import PortalUserRepository
from laneway.db.usage_stats import DEFAULT_PERIOD, PERIODS, Period
from laneway.portal import accounts, service
from laneway.portal.guards import PORTAL_COOKIE, PortalRequest

_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")


class PortalLogin(Struct):
    username: Username
    password: Annotated[str, Meta(max_length=1024)]


def usage_period(raw: str | None) -> Period:
    found = PERIODS.get(raw or DEFAULT_PERIOD)
    if found is None:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"period must be one of {', '.join(PERIODS)}.", param="period")
    return found


def key_page(request: PortalRequest) -> tuple[int | None, int]:
    params = request.query_params
    after = params.get("after")
    after_id = int_query("after", after, default=0, lo=1, hi=2**31 - 1) if after else None
    return after_id, int_query("limit", params.get("limit"), default=20, lo=1, hi=service.MAX_KEYS_PAGE)


async def close_session(admin_service: Any, token: str) -> None:
    async with admin_service.sessions() as session, session.begin():
        await PortalUserRepository(session).close_session(token_digest(token))


def logged_out_cookie() -> Cookie:
    return Cookie(key=PORTAL_COOKIE, value="", path="/portal", max_age=0)


class PortalAPI(Controller):
    path = "/portal/api"
    include_in_schema = False

    @post("/login", status_code=200, opt=PUBLIC)
    async def login(self, request: Request, logins: NamedDependency[Logins]) -> Response[dict[str, str]]:  # type: ignore[type-arg]
        creds = decode(await request.body(), PortalLogin)
        cookie, csrf = await accounts.open_portal_session(request, logins, creds.username, creds.password)
        return Response({"csrf_token": csrf, "username": creds.username}, cookies=[cookie])

    @post("/logout", status_code=200)
    async def logout(self, request: PortalRequest, admin_service: Service) -> Response[dict[str, str]]:
        await close_session(admin_service, request.cookies[PORTAL_COOKIE])
        return Response({"status": "logged_out"}, cookies=[logged_out_cookie()])

    @get("/me")
    async def me(self, request: PortalRequest) -> dict[str, Any]:
        user = request.user
        return {"username": user.username, "role": user.role, "tenant": user.tenant_name}

    @get("/keys")
    async def keys(self, request: PortalRequest, admin_service: Service) -> dict[str, Any]:
        """?after= (the page before's last_id), ?limit= (1..100, default 20): newest first."""
        after, limit = key_page(request)
        return await service.list_keys(admin_service, request.user.tenant_id, after=after, limit=limit)

    @post("/keys", status_code=201)
    async def create_key(self, request: PortalRequest, admin_service: Service) -> dict[str, Any]:
        data = decode(await request.body(), service.PortalKeyIn)
        return await service.create_key(admin_service, request.user.actor, request.user.tenant_id, data)

    @delete("/keys/{key_id:int}", status_code=200)
    async def revoke_key(self, request: PortalRequest, admin_service: Service, key_id: FromPath[int]) -> dict[str, Any]:
        return await service.revoke_key(admin_service, request.user.actor, request.user.tenant_id, key_id)

    @get("/usage")
    async def usage(self, request: PortalRequest, admin_service: Service) -> dict[str, Any]:
        """?period= hour | day (default) | 30d: totals, buckets, by model and by key."""
        period = usage_period(request.query_params.get("period"))
        return await service.usage(admin_service, request.user.tenant_id, period)

    @get("/usage.csv")
    async def usage_csv(self, request: PortalRequest, admin_service: Service) -> Stream:
        period = usage_period(request.query_params.get("period"))
        end = datetime.now(UTC)
        start = end - period.length
        name = _UNSAFE_FILENAME.sub("_", request.user.tenant_name).strip("._") or "usage"
        return Stream(
            csv_chunks(admin_service.sessions, request.user.tenant_id, start, end),
            media_type="text/csv; charset=utf-8",
            headers={
                "Content-Disposition": f'attachment; filename="usage-{name}-{period.key}-{end:%Y%m%dT%H%M%SZ}.csv"',
                "Cache-Control": "no-store",
            },
        )

    @get("/limits")
    async def limits(self, request: PortalRequest, admin_service: Service, limiter: Limiter) -> dict[str, Any]:
        return await service.limits(admin_service, limiter, request.user.tenant_id)

    @get("/refusals")
    async def refusals(self, request: PortalRequest, admin_service: Service) -> dict[str, Any]:
        """?days= (1..90, default 7): the tenant's 429s and 503s by code, with why in words."""
        days = int_query("days", request.query_params.get("days"), default=7, lo=1, hi=90)
        return await service.refusals(admin_service, request.user.tenant_id, days)

    @get("/users")
    async def users(self, request: PortalRequest, admin_service: Service) -> list[dict[str, Any]]:
        return await accounts.portal_users(admin_service, request.user.tenant_id)

    @post("/users", status_code=201)
    async def invite(self, request: PortalRequest, admin_service: Service) -> dict[str, Any]:
        """A tenant-owner invites a user of its own tenant: {"username", "password", "role"}."""
        data = decode(await request.body(), accounts.PortalUserIn)
        user = request.user
        return await accounts.create_portal_user(
            admin_service, user.actor, user.tenant_id, data.username, data.password, data.role
        )
