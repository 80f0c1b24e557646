"""Who may use /portal: the portal routers' guards, as the admin's (admin/guards.py) with the
portal's own cookie, sessions table and rule table.

`PortalGuards.session` finds the portal user's session from its cookie and puts it in
`request.user` (a PortalSession: the user, its tenant, its role, the CSRF token); without one,
401 not_logged_in (the pages redirect to /portal/login). The admin's csrf_header/csrf_form
guards check a change's token (a PortalSession carries `csrf` as an AdminSession does).
`PortalGuards.role` then checks PORTAL_RULES: tenant-member reads, tenant-owner also manages
keys and invites users; a route without a rule is refused to everyone. A refusal is 403
role_forbidden and written to the audit log.

The tenant of every query is `request.user.tenant_id`, from the session row: never from the
request, so a portal user cannot name another tenant (portal/service.py takes it first).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any, NamedTuple, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.admin.guards import NotLoggedIn, SessionGuard, route_template
from laneway.admin.security import token_digest
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.auth import as_utc
from laneway.db.portal_repositories import PortalUserRepository
from laneway.db.portal_tables import TENANT_MEMBER, TENANT_OWNER
from laneway.db.repositories import AuditRepository

PORTAL_COOKIE = "laneway_portal"
PORTAL_ACTOR = "portal:"  # audit rows of portal users: "portal:<username>"


class PortalNeed(IntEnum):
    PUBLIC = 0
    MEMBER = 1
    OWNER = 2


PORTAL_ROLE_LEVEL = {TENANT_MEMBER: PortalNeed.MEMBER, TENANT_OWNER: PortalNeed.OWNER}

_API = "/portal/api"
PORTAL_RULES: dict[tuple[str, str], PortalNeed] = {
    ("POST", f"{_API}/login"): PortalNeed.PUBLIC,
    ("POST", f"{_API}/logout"): PortalNeed.MEMBER,
    ("GET", f"{_API}/me"): PortalNeed.MEMBER,
    ("GET", f"{_API}/keys"): PortalNeed.MEMBER,
    ("POST", f"{_API}/keys"): PortalNeed.OWNER,
    ("DELETE", f"{_API}/keys/{{key_id}}"): PortalNeed.OWNER,
    ("GET", f"{_API}/usage"): PortalNeed.MEMBER,
    ("GET", f"{_API}/usage.csv"): PortalNeed.MEMBER,
    ("GET", f"{_API}/limits"): PortalNeed.MEMBER,
    ("GET", f"{_API}/refusals"): PortalNeed.MEMBER,
    ("GET", f"{_API}/users"): PortalNeed.OWNER,
    ("POST", f"{_API}/users"): PortalNeed.OWNER,
    ("GET", "/portal"): PortalNeed.MEMBER,
    ("GET", "/portal/login"): PortalNeed.PUBLIC,
    ("POST", "/portal/login"): PortalNeed.PUBLIC,
    ("POST", "/portal/logout"): PortalNeed.MEMBER,
    ("GET", "/portal/keys"): PortalNeed.MEMBER,
    ("POST", "/portal/keys"): PortalNeed.OWNER,
    ("POST", "/portal/keys/{key_id}/revoke"): PortalNeed.OWNER,
    ("GET", "/portal/usage"): PortalNeed.MEMBER,
}


def portal_rule(method: str, path_template: str) -> PortalNeed | None:
    method = "GET" if method == "HEAD" else method
    return PORTAL_RULES.get((method, path_template.rstrip("/") or "/"))


class PortalSession(NamedTuple):
    username: str
    user_id: int
    tenant_id: int
    tenant_name: str
    role: str  # tenant-owner | tenant-member
    csrf: str

    @property
    def actor(self) -> str:
        return PORTAL_ACTOR + self.username

    @property
    def is_owner(self) -> bool:
        return self.role == TENANT_OWNER


class PortalGuards(SessionGuard):
    def __init__(self, sessions: Callable[[], async_sessionmaker[AsyncSession]]) -> None:
        self._sessions = sessions

    async def lookup(self, connection: ASGIConnection[Any, Any, Any, Any]) -> PortalSession:
        token = connection.cookies.get(PORTAL_COOKIE)
        if not token:
            raise NotLoggedIn("Log in first.")
        async with self._sessions()() as session:
            found = await PortalUserRepository(session).find_session(token_digest(token))
            if found is None or as_utc(found.expires_at) <= datetime.now(UTC):
                raise NotLoggedIn("Your session has expired; log in again.")
            user = found.user
            return PortalSession(
                str(user.username),
                int(user.id),
                int(user.tenant_id),
                str(user.tenant.name),
                str(user.role),
                found.csrf_token,
            )

    async def role(self, connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        method = str(connection.scope.get("method", "GET"))
        if method == "OPTIONS":
            return
        template = route_template(connection)
        need = portal_rule(method, template)
        user = cast("PortalSession | None", connection.scope.get("user"))
        if need == PortalNeed.PUBLIC or (need is not None and user is None):
            return
        if user is not None and need is not None and PORTAL_ROLE_LEVEL.get(user.role, PortalNeed.PUBLIC) >= need:
            return
        actor = user.actor if user is not None else "anonymous"
        async with self._sessions()() as session, session.begin():
            after = {"role": user.role if user else "none", "needs": need.name.lower() if need else "no rule"}
            await AuditRepository(session).add(actor, "deny", "route", f"{method} {template}"[:200], None, after)
        if need is None:
            raise GatewayError(ErrorCode.ROLE_FORBIDDEN, "This route has no access rule; nobody may use it.")
        raise GatewayError(ErrorCode.ROLE_FORBIDDEN, "Only your organisation's tenant-owner may do this.")


PortalRequest = Request[PortalSession, Any, Any]
MaybePortalRequest = Request[PortalSession | None, Any, Any]
