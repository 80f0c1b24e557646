"""How the OpenAPI document describes the admin API's security: the session cookie, and the
CSRF token a change must echo. The composition (app.py) adds these schemes to the document's
config (api/openapi.py); the admin routes name the requirements."""

from __future__ import annotations

from litestar.openapi.spec import SecurityRequirement, SecurityScheme

# Security requirements, by the names of the schemes in security_schemes().
ADMIN_SESSION: list[SecurityRequirement] = [{"adminSession": []}]
ADMIN_CHANGE: list[SecurityRequirement] = [{"adminSession": [], "csrfToken": []}]


def security_schemes(session_cookie: str) -> dict[str, SecurityScheme]:
    """The admin API's schemes (`session_cookie`: the admin session's cookie)."""
    return {
        "adminSession": SecurityScheme(
            type="apiKey",
            name=session_cookie,
            security_scheme_in="cookie",
            description="The session cookie POST /admin/api/login sets.",
        ),
        "csrfToken": SecurityScheme(
            type="apiKey",
            name="X-CSRF-Token",
            security_scheme_in="header",
            description="The csrf_token the login returned; every change must echo it.",
        ),
    }
