"""Portal users: invited by an operator (the admin API, the CLI) or by a tenant-owner of the
same tenant; and their login, through the admin's login throttle and bounded argon2 pool
(admin/throttle.py), with their own sessions table and cookie."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from litestar import Request
from litestar.datastructures import Cookie
from msgspec import Meta, Struct

from laneway.admin.api import Logins, client_address, tarpit
from laneway.admin.names import check_account_name
from laneway.admin.security import MIN_PASSWORD_CHARS, hash_password, new_session_token
from laneway.admin.service import AdminService, get_or_404
from laneway.admin.validation import Username, check_text
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.models import Tenant
from laneway.db.portal_repositories import PortalUserRepository
from laneway.db.portal_tables import PORTAL_ROLES
from laneway.db.repositories import AuditRepository
from laneway.portal.guards import PORTAL_COOKIE

SESSION_TTL = timedelta(hours=12)
# The throttle's counters are shared with the admin login: a portal name is kept apart by this.
_THROTTLE_PREFIX = "portal:"


class PortalUserIn(Struct, forbid_unknown_fields=True):
    username: Username
    password: Annotated[str, Meta(max_length=1024)]
    role: str


def check_portal_role(role: str) -> str:
    if role not in PORTAL_ROLES:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"role must be one of {', '.join(PORTAL_ROLES)} (got {role[:40]!r}).",
            param="role",
        )
    return role


async def create_portal_user(
    svc: AdminService, actor: str, tenant_id: int, username: str, password: str, role: str
) -> dict[str, Any]:
    """A new user of the tenant's portal, audited; nothing is created when any check fails."""
    check_account_name("username", username)
    check_portal_role(role)
    if len(password) < MIN_PASSWORD_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"A portal password needs at least {MIN_PASSWORD_CHARS} characters.",
            param="password",
        )
    digest = await asyncio.to_thread(hash_password, password)  # argon2: 0.3 s of CPU, off the loop
    async with svc.sessions() as session, session.begin():
        tenant = await get_or_404(session, Tenant, tenant_id)
        users = PortalUserRepository(session)
        if await users.get_by_username(username) is not None:
            raise GatewayError(ErrorCode.CONFLICT, f"A portal user named '{username}' exists.", param="username")
        user = await users.create(tenant.id, username, digest, role)
        after = {"id": user.id, "tenant_id": tenant.id, "tenant": tenant.name, "username": username, "role": role}
        await AuditRepository(session).add(actor, "create", "portal_user", str(user.id), None, after)
    return after


async def portal_users(svc: AdminService, tenant_id: int) -> list[dict[str, Any]]:
    async with svc.sessions() as session:
        found = await PortalUserRepository(session).of_tenant(tenant_id)
        return [
            {
                "id": u.id,
                "username": u.username,
                "role": u.role,
                "created_at": u.created_at.isoformat(),
                "last_login_at": u.last_login_at.isoformat() if u.last_login_at else None,
            }
            for u in found
        ]


async def open_portal_session(
    request: Request,  # type: ignore[type-arg]
    logins: Logins,
    username: str,
    password: str,
) -> tuple[Cookie, str]:
    """As the admin's open_session: throttled before any check, argon2 off the loop, 401 on a
    wrong name or password alike; then a session row and its cookie (path /portal)."""
    check_text("username", username, max_length=120)
    guard = logins.guard
    try:
        attempt = guard.throttle.begin(_THROTTLE_PREFIX + username, client_address(request))
    except GatewayError:
        await tarpit()
        raise
    try:
        async with logins.sessions() as session:
            user = await PortalUserRepository(session).get_by_username(username)
            user_id = user.id if user else None
        check = guard.verifier.submit(user.password_hash if user else None, password)
    except BaseException as exc:
        attempt.finish(None)
        if isinstance(exc, GatewayError) and exc.status == 429:
            await tarpit()
        raise

    def settle(done: asyncio.Future[bool]) -> None:
        ok = None if done.cancelled() or done.exception() else done.result() and user_id is not None
        attempt.finish(ok)

    check.add_done_callback(settle)
    if not await asyncio.shield(check) or user_id is None:
        raise GatewayError(ErrorCode.INVALID_CREDENTIALS, "Wrong username or password.")
    token, digest, csrf = new_session_token()
    async with logins.sessions() as session, session.begin():
        repo = PortalUserRepository(session)
        found = await repo.get_by_username(username)
        if found is None:
            raise GatewayError(ErrorCode.INVALID_CREDENTIALS, "Wrong username or password.")
        await repo.open_session(found, digest, csrf, datetime.now(UTC) + SESSION_TTL)
    cookie = Cookie(
        key=PORTAL_COOKIE,
        value=token,
        path="/portal",
        httponly=True,
        samesite="strict",
        secure=logins.cookie_secure,
        max_age=int(SESSION_TTL.total_seconds()),
    )
    return cookie, csrf
