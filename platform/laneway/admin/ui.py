"""The admin web UI: server-rendered Jinja pages (admin-ui/templates), enhanced with htmx
(vendored in admin-ui/static, no CDN). It uses the same sessions, CSRF tokens and admin
operations as the JSON API; every form carries the session's CSRF token.

This module: the login and logout, and what every page controller shares (the redirect to
the login, the package data's place). The pages by area: tenant_pages.py, policy_pages.py,
model_pages.py, dashboard_pages.py, audit_pages.py, usage_ui.py.
"""

from __future__ import annotations

import secrets

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.response import Redirect, Template

from laneway.admin.api import Logins, open_session
from laneway.admin.forms import form_of
from laneway.admin.guards import OPTIONAL, PUBLIC, SESSION_COOKIE, MaybeAdminRequest, NotLoggedIn, check_csrf
from laneway.admin.security import token_digest
from laneway.admin.service import AdminService
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import AdminRepository
from laneway.resources import ADMIN_TEMPLATES, package_dir

# admin-ui/ (templates/ and static/), read as package data: found from any working directory.
ADMIN_UI_DIR = package_dir(ADMIN_TEMPLATES).parent
LOGIN_CSRF_COOKIE = "laneway_login_csrf"

Page = Template | Redirect


async def _first_login(logins: Logins) -> dict[str, str] | None:
    """How to get in, while no admin has ever logged in: where the first start wrote the
    generated password, or how to create an admin."""
    async with logins.sessions() as session:
        repo = AdminRepository(session)
        if await repo.anyone_logged_in():
            return None
        has_admin = await repo.count() > 0
    password_file = logins.password_file
    if has_admin and password_file.is_file():
        return {"username": "admin", "password_file": str(password_file.resolve())}
    return {"username": "", "password_file": ""} if not has_admin else None


def to_login(_: Request, __: NotLoggedIn) -> Redirect:  # type: ignore[type-arg]
    """The pages' answer to a request without a live session (the JSON API's is a 401)."""
    return Redirect("/admin/login", status_code=303)


class AdminUI(Controller):
    """Behind the admin guards (admin/guards.py): logged out, a page redirects to the login;
    every POST carries the session's CSRF token in its form."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    @get("/", opt=OPTIONAL)
    async def home(self, request: MaybeAdminRequest) -> Redirect:
        return Redirect("/admin/dashboard" if request.user is not None else "/admin/login", status_code=303)

    @get("/login", opt=PUBLIC)
    async def login_page(self, logins: NamedDependency[Logins]) -> Template:
        token = secrets.token_urlsafe(24)
        cookie = Cookie(key=LOGIN_CSRF_COOKIE, value=token, path="/admin", httponly=True, samesite="strict")
        return Template(
            "login.html", context={"login_csrf": token, "first_login": await _first_login(logins)}, cookies=[cookie]
        )

    @post("/login", opt=PUBLIC)
    async def login(self, request: Request, logins: NamedDependency[Logins]) -> Page:  # type: ignore[type-arg]
        form = await form_of(request)
        expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")  # no session yet: the login form's own token
        try:
            check_csrf(form.get("csrf_token", ""), expected)
            cookie, _ = await open_session(request, logins, form.get("username", ""), form.get("password", ""))
        except GatewayError as exc:  # 401 wrong, 429 throttled (with Retry-After), 400 bad username
            return Template(
                "login.html",
                context={"login_csrf": expected, "error": exc.message},
                status_code=exc.status,
                headers=exc.headers,
            )
        return Redirect("/admin/dashboard", status_code=303, cookies=[cookie])  # the live view first

    @post("/logout", opt=OPTIONAL)
    async def logout(self, request: MaybeAdminRequest, admin_service: NamedDependency[AdminService]) -> Redirect:
        if request.user is not None:  # the guard checked the form's CSRF token
            async with admin_service.sessions() as session, session.begin():
                await AdminRepository(session).close_session(token_digest(request.cookies[SESSION_COOKIE]))
        return Redirect(
            "/admin/login", status_code=303, cookies=[Cookie(key=SESSION_COOKIE, value="", path="/admin", max_age=0)]
        )
