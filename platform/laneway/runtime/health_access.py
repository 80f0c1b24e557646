"""Who may read /health/ready's details (aliases, deployments and why they fail): a caller
with the metrics token (as /metrics), or an admin with a live session. The API's health
route asks through the `details_allowed` dependency; knowing both the setting and the admin
sessions is this layer's job, so the API needs no import of admin/ (docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from laneway.admin.guards import SESSION_COOKIE, AdminGuards, NotLoggedIn
from laneway.api.health import bearer_matches


class HealthDetailsAccess:
    def __init__(self, metrics_token: str | None, admins: AdminGuards) -> None:
        self._metrics_token = metrics_token
        self._admins = admins

    async def details_allowed(self, request: Request[Any, Any, Any]) -> bool:
        """The metrics token, else an admin session cookie that is live (one database read, only
        when such a cookie is sent: an anonymous probe costs nothing)."""
        if bearer_matches(request, self._metrics_token):
            return True
        if not request.cookies.get(SESSION_COOKIE):
            return False
        try:
            await self._admins.lookup(request)
        except NotLoggedIn:
            return False
        return True
