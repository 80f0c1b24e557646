"""Admin operations on admin accounts: create one with a role (the password's rules as at
first start), list them, change one's role; each change audited. Owners only (admin/roles.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from msgspec import Meta, Struct
from sqlalchemy import func, select

from laneway.admin.names import check_account_name
from laneway.admin.roles import OWNER, ROLES
from laneway.admin.security import MIN_PASSWORD_CHARS, hash_password
from laneway.admin.service import AdminService
from laneway.admin.validation import Username
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.models import Admin
from laneway.db.repositories import AdminRepository, AuditRepository

ADMIN_FIELDS = ("id", "username", "role", "created_at", "last_login_at")


class AdminIn(Struct, forbid_unknown_fields=True):
    username: Username
    password: Annotated[str, Meta(max_length=1024)]
    role: str


class RoleIn(Struct, forbid_unknown_fields=True):
    role: str


def check_role(role: str) -> str:
    if role not in ROLES:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST, f"role must be one of {', '.join(ROLES)} (got {role[:40]!r}).", param="role"
        )
    return role


def _said(admin: Admin) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in ADMIN_FIELDS:
        value = getattr(admin, field)
        out[field] = value.isoformat() if hasattr(value, "isoformat") else value
    return out


async def create_admin(
    svc: AdminService, actor: str, username: str, password: str, role: str = OWNER
) -> dict[str, Any]:
    """A new admin account (the password's rules as at first start), audited."""
    check_account_name("username", username)
    check_role(role)
    if len(password) < MIN_PASSWORD_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"An admin password needs at least {MIN_PASSWORD_CHARS} characters.",
            param="password",
        )
    digest = await asyncio.to_thread(hash_password, password)  # argon2: 0.3 s of CPU, off the loop
    async with svc.sessions() as session, session.begin():
        admins = AdminRepository(session)
        if await admins.get_by_username(username) is not None:
            raise GatewayError(ErrorCode.CONFLICT, f"An admin named '{username}' exists.", param="username")
        admin = await admins.create(username, digest)
        admin.role = role
        await session.flush()
        after = {"id": admin.id, "username": username, "role": role}
        await AuditRepository(session).add(actor, "create", "admin", str(admin.id), None, after)
    return after


async def list_admins(svc: AdminService) -> list[dict[str, Any]]:
    async with svc.sessions() as session:
        rows = await session.execute(select(Admin).order_by(Admin.username).limit(1000))
        return [_said(a) for a in rows.scalars()]


async def set_role(svc: AdminService, actor: str, username: str, role: str) -> dict[str, Any]:
    """Change an admin's role; the last owner cannot be demoted (nobody could undo it)."""
    check_role(role)
    async with svc.sessions() as session, session.begin():
        admin = await AdminRepository(session).get_by_username(username)
        if admin is None:
            raise GatewayError(ErrorCode.NOT_FOUND, f"No admin named '{username[:120]}'.")
        before = _said(admin)
        if admin.role == OWNER and role != OWNER:
            owners = await session.execute(select(func.count()).where(Admin.role == OWNER))
            if int(owners.scalar_one()) <= 1:
                raise GatewayError(
                    ErrorCode.CONFLICT, f"'{username}' is the last owner; make another owner first.", param="role"
                )
        admin.role = role
        await session.flush()
        after = _said(admin)
        await AuditRepository(session).add(actor, "update", "admin", str(admin.id), before, after)
    return after
