"""The admin page of the audit log: the last changes, who made them and what changed."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.response import Template

from laneway.admin.guards import AdminRequest, NotLoggedIn
from laneway.admin.presentation import audit_changes, iso_utc
from laneway.admin.service import AUDIT_FIELDS, AdminService, row
from laneway.admin.ui import Page, to_login
from laneway.db.repositories import AuditRepository


class AuditPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    @get("/audit")
    async def audit(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        current = request.user
        async with admin_service.sessions() as session:
            entries = [
                {**row(e, AUDIT_FIELDS), "at": iso_utc(e.at), "changes": audit_changes(e.before, e.after)}
                for e in await AuditRepository(session).recent(200)
            ]
        return Template("audit.html", context={"admin": current.username, "csrf": current.csrf, "entries": entries})
