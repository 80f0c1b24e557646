"""Every admin and portal route has an access rule, and every rule names a route: a route added
without one fails here (and is refused to everyone at run time: the guards fail closed)."""

from __future__ import annotations

from laneway.admin.roles import ADMIN_RULES, OPERATOR, OWNER, VIEWER, Need, allows, rule_for
from laneway.app import create_app
from laneway.portal.guards import PORTAL_RULES
from laneway.settings import Settings

IGNORED_METHODS = {"OPTIONS", "HEAD"}  # Litestar's own answers; HEAD is looked up as GET


def app_routes(prefix: str) -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves under `prefix`."""
    app = create_app(Settings(bootstrap_demo=False))
    found = set()
    for route in app.routes:
        if route.path_format == prefix or route.path_format.startswith(prefix + "/"):
            for method in getattr(route, "methods", ()):
                if method not in IGNORED_METHODS:
                    found.add((method, route.path_format))
    return found


def test_every_admin_route_has_a_rule_and_every_rule_a_route() -> None:
    routes = app_routes("/admin")
    assert sorted(routes - set(ADMIN_RULES)) == [], "admin routes without a rule in admin/roles.py ADMIN_RULES"
    assert sorted(set(ADMIN_RULES) - routes) == [], "rules for routes that do not exist"


def test_every_portal_route_has_a_rule_and_every_rule_a_route() -> None:
    routes = app_routes("/portal")
    assert sorted(routes - set(PORTAL_RULES)) == [], "portal routes without a rule in portal/guards.py"
    assert sorted(set(PORTAL_RULES) - routes) == [], "rules for routes that do not exist"


def test_the_roles_nest_and_a_route_without_a_rule_needs_what_nobody_has() -> None:
    assert [allows(VIEWER, n) for n in Need] == [True, True, False, False]
    assert [allows(OPERATOR, n) for n in Need] == [True, True, True, False]
    assert all(allows(OWNER, n) for n in Need)
    assert not allows("superuser", Need.VIEW)  # a role nobody defined may do nothing
    assert rule_for("GET", "/admin/api/no-such-route") is None
    assert rule_for("HEAD", "/admin/api/tenants") == Need.VIEW


def test_prices_and_admin_accounts_are_the_owners_and_every_read_is_the_viewers() -> None:
    owners_only = {route for route, need in ADMIN_RULES.items() if need == Need.OWN}
    assert owners_only == {
        ("PUT", "/admin/api/models/{alias}/price"),
        ("POST", "/admin/models/price"),
        ("GET", "/admin/api/admins"),
        ("POST", "/admin/api/admins"),
        ("PATCH", "/admin/api/admins/{username}"),
    }
    reads = {need for (method, path), need in ADMIN_RULES.items() if method == "GET" and "admins" not in path}
    assert reads <= {Need.VIEW, Need.PUBLIC}
