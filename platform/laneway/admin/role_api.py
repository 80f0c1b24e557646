"""The admin JSON API for engine swaps (admin/deployment_roles.py, core/canary/): a replica's role, the
promote and rollback actions, and the alias's comparison of its candidate with its serving
pool. Behind the same guards as the rest of /admin/api (a session; a CSRF token to change)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get, patch, post
from litestar.params import FromPath

from laneway.admin import deployment_roles
from laneway.admin.dependencies import Service, Swaps
from laneway.admin.guards import AdminRequest
from laneway.admin.openapi import ADMIN_CHANGE, ADMIN_SESSION
from laneway.admin.validation import decode
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError


class RoleAPI(Controller):
    path = "/admin/api/models"

    @patch("/{alias:str}/replicas/{name:str}/role", security=ADMIN_CHANGE)
    async def set_role(
        self, request: AdminRequest, admin_service: Service, alias: FromPath[str], name: FromPath[str]
    ) -> dict[str, Any]:
        """{"role": "serving" | "canary" | "shadow", "weight": 0-100, "sample": 0-100} (percent):
        a canary's share of the alias's sessions, a shadow's of its live requests. Audited."""
        data = decode(await request.body(), deployment_roles.RoleIn)
        return await deployment_roles.set_role(admin_service, request.user.username, alias, name, data)

    @post("/{alias:str}/replicas/{name:str}/promote", status_code=200, security=ADMIN_CHANGE)
    async def promote(
        self, request: AdminRequest, admin_service: Service, alias: FromPath[str], name: FromPath[str]
    ) -> dict[str, Any]:
        """The candidate becomes the serving pool; the replicas that served leave (they drain)."""
        return await deployment_roles.promote(admin_service, request.user.username, alias, name)

    @post("/{alias:str}/replicas/{name:str}/rollback", status_code=200, security=ADMIN_CHANGE)
    async def rollback(
        self, request: AdminRequest, admin_service: Service, alias: FromPath[str], name: FromPath[str]
    ) -> dict[str, Any]:
        """The canary takes no new session (weight 0); what it runs finishes."""
        return await deployment_roles.rollback(admin_service, request.user.username, alias, name)

    @get("/{alias:str}/compare", security=ADMIN_SESSION)
    async def compare(self, swap_figures: Swaps, alias: FromPath[str]) -> dict[str, Any]:
        """Each pool's figures over the canary watch's window, and the shadow's comparison."""
        figures = swap_figures(alias)
        if not figures["deployments"]:
            raise GatewayError(ErrorCode.NOT_FOUND, f"No model named '{alias}' is served here.", param="alias")
        return figures
