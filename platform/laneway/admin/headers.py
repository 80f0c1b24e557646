"""Security headers on every /admin and /portal response (pages, JSON API, static files, errors, 404s).

The pages load no inline script or style: htmx and the stylesheet come from /admin/static,
and htmx's own indicator <style> is turned off in base.html (includeIndicatorStyles: false),
so the policy allows only 'self' for scripts and styles. SVG presentation attributes
(fill, font-size) in the dashboard chart are not inline styles and need no allowance.
"""

from __future__ import annotations

from litestar.types import Message, Scope

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
ADMIN_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


async def admin_security_headers(message: Message, scope: Scope) -> None:
    """A before_send hook: adds ADMIN_HEADERS to the start of any response under /admin or
    /portal. Cheap for everything else (one dict lookup per message)."""
    if message["type"] != "http.response.start":
        return
    path: str = scope.get("path", "")
    root = "/admin" if path.startswith("/admin") else "/portal" if path.startswith("/portal") else None
    if root is None or (len(path) > len(root) and path[len(root)] != "/"):  # /administrator is not ours
        return
    headers = list(message.get("headers") or ())
    present = {name.lower() for name, _ in headers}
    headers.extend(h for h in ADMIN_HEADERS if h[0] not in present)
    message["headers"] = headers
