"""Who may use /admin: the admin routers' guards (Litestar runs them before the handler and
its dependencies).

`AdminGuards.session` finds the admin's session from the cookie and puts it in
`request.user` (an AdminSession); without a valid one it raises NotLoggedIn (401
not_logged_in: the JSON API answers it, the UI's routers turn it into a redirect to the login
page). A handler opts out with `opt=PUBLIC` (the login forms) or takes the session when there
is one with `opt=OPTIONAL` (`request.user` is then None without one).

`AdminGuards.role` then checks the admin's role against the route's rule (admin/roles.py
ADMIN_RULES): too low, or a route without a rule, is 403 role_forbidden, written to the audit
log. It runs after the CSRF check, so a forged cross-site form cannot fill the log.

A change (any method but GET/HEAD/OPTIONS) must carry the session's CSRF token: the JSON API in the
X-CSRF-Token header (`csrf_header`), the UI's forms in their csrf_token field (`csrf_form`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from laneway.admin.roles import Need, allows, rule_for
from laneway.admin.security import token_digest
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.auth import as_utc
from laneway.db.repositories import AdminRepository, AuditRepository

SESSION_COOKIE = "laneway_admin"
SESSION_OPT = "admin_session"
PUBLIC = {SESSION_OPT: "none"}  # no session looked up, no CSRF checked
OPTIONAL = {SESSION_OPT: "optional"}  # the session if there is one; a change still needs its token
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class AdminSession(NamedTuple):
    username: str
    csrf: str  # the token bound to the session, echoed by every change
    role: str = "viewer"  # owner | operator | viewer (admin/roles.py)

    def can(self, need: str) -> bool:
        """For the pages: whether to show what needs `need` ("view", "operate", "own")."""
        return allows(self.role, Need[need.upper()])


class NotLoggedIn(GatewayError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.NOT_LOGGED_IN, message)


class SessionGuard:
    """The session guard of a surface with its own sessions (the admin's, the portal's): the
    route's SESSION_OPT ("required", "optional", "none") against what `lookup` finds."""

    async def lookup(self, connection: ASGIConnection[Any, Any, Any, Any]) -> object:
        raise NotImplementedError

    async def session(self, connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        mode = handler.opt.get(SESSION_OPT, "required")
        if mode == "none" or connection.scope.get("method") == "OPTIONS":  # Litestar's own Allow answer
            return
        try:
            connection.scope["user"] = await self.lookup(connection)
        except NotLoggedIn:
            if mode != "optional":
                raise
            connection.scope["user"] = None


class AdminGuards(SessionGuard):
    """The session guard over the database the app's runtime opened (`sessions` is called
    per request: the session factory exists once the lifespan has started)."""

    def __init__(self, sessions: Callable[[], async_sessionmaker[AsyncSession]]) -> None:
        self._sessions = sessions

    async def lookup(self, connection: ASGIConnection[Any, Any, Any, Any]) -> AdminSession:
        """The admin session of the request's cookie; NotLoggedIn without a live one."""
        token = connection.cookies.get(SESSION_COOKIE)
        if not token:
            raise NotLoggedIn("Log in first.")
        async with self._sessions()() as session:
            found = await AdminRepository(session).find_session(token_digest(token))
            if found is None or as_utc(found.expires_at) <= datetime.now(UTC):
                raise NotLoggedIn("Your admin session has expired; log in again.")
            return AdminSession(str(found.admin.username), found.csrf_token, str(found.admin.role))

    async def role(self, connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        """The route's rule against the admin's role; a refusal is audited, then 403."""
        method = str(connection.scope.get("method", "GET"))
        if method == "OPTIONS":
            return
        template = route_template(connection)
        need = rule_for(method, template)
        admin = cast("AdminSession | None", connection.scope.get("user"))
        if need == Need.PUBLIC or (need is not None and admin is None):  # PUBLIC/OPTIONAL: the session guard decided
            return
        if admin is not None and need is not None and allows(admin.role, need):
            return
        who = admin.username if admin is not None else "anonymous"
        role = admin.role if admin is not None else "none"
        async with self._sessions()() as session, session.begin():
            wanted = need.name.lower() if need is not None else "no rule"
            after = {"role": role, "needs": wanted}
            await AuditRepository(session).add(who, "deny", "route", f"{method} {template}"[:200], None, after)
        raise forbidden(role, need)


def route_template(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The matched route's path as registered, parameters untyped ("/admin/api/keys/{key_id}"), not the
    request's path: the rule tables are keyed by it."""
    return str(connection.scope.get("path_template") or connection.scope.get("path", ""))


def forbidden(role: str, need: Need | None) -> GatewayError:
    if need is None:
        return GatewayError(ErrorCode.ROLE_FORBIDDEN, "This route has no access rule; nobody may use it.")
    least = {Need.VIEW: "viewer", Need.OPERATE: "operator", Need.OWN: "owner"}[need]
    above = " or owner" if need == Need.OPERATE else " or above" if need == Need.VIEW else ""
    return GatewayError(ErrorCode.ROLE_FORBIDDEN, f"Your role ({role}) may not do this; it needs {least}{above}.")


def check_csrf(given: str, expected: str) -> None:
    if not given or not secrets.compare_digest(given, expected):
        raise GatewayError(ErrorCode.CSRF_FAILED, "Missing or wrong CSRF token.")


def _changing(connection: ASGIConnection[Any, Any, Any, Any]) -> AdminSession | None:
    """The session a change must prove it comes from; None when nothing is to check."""
    if connection.scope.get("method") in _SAFE_METHODS:
        return None
    return cast("AdminSession | None", connection.scope.get("user"))


# Guards are async even with nothing to await: Litestar runs a sync guard in a worker thread.
async def csrf_header(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    if (admin := _changing(connection)) is not None:
        check_csrf(connection.headers.get("x-csrf-token", ""), admin.csrf)


async def csrf_form(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """The form is parsed here once; the handler's `request.form()` gets the same parse."""
    if (admin := _changing(connection)) is not None:
        form = await cast("Request[Any, Any, Any]", connection).form()
        fields = {k: str(v) for k, v in form.items()}  # as the handlers read it: the last value wins
        check_csrf(fields.get("csrf_token", ""), admin.csrf)


# A handler's request behind the session guard: `request.user` is the admin's session (None
# on an OPTIONAL route without one).
AdminRequest = Request[AdminSession, Any, Any]
MaybeAdminRequest = Request[AdminSession | None, Any, Any]
