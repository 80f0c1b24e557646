"""Admin operation on admin accounts: create one (the password's rules as at first start), audited."""

from __future__ import annotations

from typing import Any

from laneway.admin.security import MIN_PASSWORD_CHARS, hash_password
from laneway.admin.service import AdminService
from laneway.admin.validation import check_text
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import AdminRepository, AuditRepository


async def create_admin(svc: AdminService, actor: str, username: str, password: str) -> dict[str, Any]:
    """A new admin account (the password's rules as at first start), audited."""
    check_text("username", username, max_length=100)
    if len(password) < MIN_PASSWORD_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"An admin password needs at least {MIN_PASSWORD_CHARS} characters.",
            param="password",
        )
    async with svc.sessions() as session, session.begin():
        admins = AdminRepository(session)
        if await admins.get_by_username(username) is not None:
            raise GatewayError(ErrorCode.CONFLICT, f"An admin named '{username}' exists.", param="username")
        admin = await admins.create(username, hash_password(password))
        await session.flush()
        after = {"id": admin.id, "username": username}
        await AuditRepository(session).add(actor, "create", "admin", str(admin.id), None, after)
    return after
