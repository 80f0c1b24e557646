"""The JSON admin API's accounts: who is logged in (GET /admin/api/me, any role), and the
admin accounts with their roles (owners only, by the rule table in admin/roles.py)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get, patch, post
from litestar.params import FromPath

from laneway.admin import accounts
from laneway.admin.dependencies import Service
from laneway.admin.guards import AdminRequest
from laneway.admin.openapi import ADMIN_CHANGE, ADMIN_SESSION
from laneway.admin.validation import check_text, decode


class AdminAccountsAPI(Controller):
    """Behind the same guards as AdminAPI: the session, the CSRF token of a change, the role."""

    path = "/admin/api"

    @get("/me", security=ADMIN_SESSION)
    async def me(self, request: AdminRequest) -> dict[str, Any]:
        """The logged-in admin's name and role, and what that role may do."""
        user = request.user
        can = [need for need in ("view", "operate", "own") if user.can(need)]
        return {"username": user.username, "role": user.role, "can": can}

    @get("/admins", security=ADMIN_SESSION)
    async def admins(self, admin_service: Service) -> list[dict[str, Any]]:
        return await accounts.list_admins(admin_service)

    @post("/admins", status_code=201, security=ADMIN_CHANGE)
    async def create(self, request: AdminRequest, admin_service: Service) -> dict[str, Any]:
        """{"username", "password", "role": "owner" | "operator" | "viewer"}."""
        data = decode(await request.body(), accounts.AdminIn)
        return await accounts.create_admin(
            admin_service, request.user.username, data.username, data.password, data.role
        )

    @patch("/admins/{username:str}", security=ADMIN_CHANGE)
    async def set_role(self, request: AdminRequest, admin_service: Service, username: FromPath[str]) -> dict[str, Any]:
        """{"role": ...}; the last owner cannot be demoted (409)."""
        check_text("username", username, max_length=120)
        data = decode(await request.body(), accounts.RoleIn)
        return await accounts.set_role(admin_service, request.user.username, username, data.role)
