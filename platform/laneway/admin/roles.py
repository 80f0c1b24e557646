"""Operator roles, and the one table that says which role each admin route needs.

- `viewer`: reads everything (tenants, keys, usage, lanes, models, batches, the audit log).
- `operator`: the viewer's reads, and changes tenants, keys, quotas, lanes, task policies,
  models, replicas, fallbacks and batches; not admin accounts, not prices.
- `owner`: everything, admin accounts and prices included.

ADMIN_RULES maps every admin route, by its method and path template as Litestar registers it
(parameters without their types), to what it needs. The guard (admin/guards.py
AdminGuards.role) looks the route up there: a route with no rule is refused to everyone (fail
closed), and tests/unit/test_route_rules.py fails when the app has a route no table names.
"""

from __future__ import annotations

from enum import IntEnum

OWNER = "owner"
OPERATOR = "operator"
VIEWER = "viewer"
ROLES = (OWNER, OPERATOR, VIEWER)


class Need(IntEnum):
    """What a route needs, in order: each role may do what its level and those below allow."""

    PUBLIC = 0  # no session (the login forms, static files)
    VIEW = 1
    OPERATE = 2
    OWN = 3


ROLE_LEVEL = {VIEWER: Need.VIEW, OPERATOR: Need.OPERATE, OWNER: Need.OWN}


def allows(role: str, need: Need) -> bool:
    """An unknown role (a row edited by hand) may do nothing."""
    return ROLE_LEVEL.get(role, Need.PUBLIC) >= need


_API = "/admin/api"
_T = "/tenants/{tenant_id}"
_REPLICA = "/models/{alias}/replicas/{name}"

ADMIN_RULES: dict[tuple[str, str], Need] = {
    # ---- JSON API ----
    ("POST", f"{_API}/login"): Need.PUBLIC,
    ("POST", f"{_API}/logout"): Need.VIEW,
    ("GET", f"{_API}/me"): Need.VIEW,
    ("GET", f"{_API}/tenants"): Need.VIEW,
    ("POST", f"{_API}/tenants"): Need.OPERATE,
    ("PATCH", f"{_API}{_T}"): Need.OPERATE,
    ("GET", f"{_API}{_T}/keys"): Need.VIEW,
    ("POST", f"{_API}{_T}/keys"): Need.OPERATE,
    ("GET", f"{_API}{_T}/usage"): Need.VIEW,
    ("PATCH", f"{_API}/keys/{{key_id}}"): Need.OPERATE,
    ("DELETE", f"{_API}/keys/{{key_id}}"): Need.OPERATE,
    ("GET", f"{_API}{_T}/portal"): Need.VIEW,
    ("PUT", f"{_API}{_T}/portal/caps"): Need.OPERATE,
    ("POST", f"{_API}{_T}/portal/users"): Need.OPERATE,
    ("GET", f"{_API}/lanes"): Need.VIEW,
    ("PUT", f"{_API}/lanes"): Need.OPERATE,
    ("PUT", f"{_API}/lanes/{{name}}"): Need.OPERATE,
    ("DELETE", f"{_API}/lanes/{{name}}"): Need.OPERATE,
    ("PUT", f"{_API}/tasks/{{task}}"): Need.OPERATE,
    ("DELETE", f"{_API}/tasks/{{task}}"): Need.OPERATE,
    ("PUT", f"{_API}/models/{{alias}}"): Need.OPERATE,
    ("POST", f"{_API}/models/{{alias}}/replicas"): Need.OPERATE,
    ("PUT", f"{_API}{_REPLICA}"): Need.OPERATE,
    ("PATCH", f"{_API}{_REPLICA}"): Need.OPERATE,
    ("DELETE", f"{_API}{_REPLICA}"): Need.OPERATE,
    ("GET", f"{_API}/models/{{alias}}/fallbacks"): Need.VIEW,
    ("PUT", f"{_API}/models/{{alias}}/fallbacks"): Need.OPERATE,
    ("GET", f"{_API}/models/{{alias}}/price"): Need.VIEW,
    ("PUT", f"{_API}/models/{{alias}}/price"): Need.OWN,
    ("GET", f"{_API}/batches"): Need.VIEW,
    ("POST", f"{_API}/batches/{{batch_id}}/cancel"): Need.OPERATE,
    ("GET", f"{_API}/audit"): Need.VIEW,
    ("GET", f"{_API}/usage"): Need.VIEW,
    # an alias's deployment roles (admin/deployment_roles.py): canary weights and shadows
    ("PATCH", f"{_API}{_REPLICA}/role"): Need.OPERATE,
    ("POST", f"{_API}{_REPLICA}/promote"): Need.OPERATE,
    ("POST", f"{_API}{_REPLICA}/rollback"): Need.OPERATE,
    ("GET", f"{_API}/models/{{alias}}/compare"): Need.VIEW,
    ("GET", f"{_API}/admins"): Need.OWN,
    ("POST", f"{_API}/admins"): Need.OWN,
    ("PATCH", f"{_API}/admins/{{username}}"): Need.OWN,
    # ---- pages ----
    ("GET", "/admin"): Need.VIEW,
    ("GET", "/admin/login"): Need.PUBLIC,
    ("POST", "/admin/login"): Need.PUBLIC,
    ("POST", "/admin/logout"): Need.VIEW,
    ("GET", "/admin/static/{file_path}"): Need.PUBLIC,
    ("GET", "/admin/dashboard"): Need.VIEW,
    ("GET", "/admin/dashboard/panel"): Need.VIEW,
    ("GET", "/admin/audit"): Need.VIEW,
    ("GET", "/admin/tenants"): Need.VIEW,
    ("POST", "/admin/tenants"): Need.OPERATE,
    ("GET", f"/admin{_T}"): Need.VIEW,
    ("POST", f"/admin{_T}"): Need.OPERATE,
    ("POST", f"/admin{_T}/keys"): Need.OPERATE,
    ("POST", "/admin/keys/{key_id}/limits"): Need.OPERATE,
    ("POST", "/admin/keys/{key_id}/revoke"): Need.OPERATE,
    ("GET", f"/admin{_T}/usage"): Need.VIEW,
    ("GET", f"/admin{_T}/usage/panel"): Need.VIEW,
    ("GET", f"/admin{_T}/usage.csv"): Need.VIEW,
    ("GET", "/admin/policies"): Need.VIEW,
    ("POST", "/admin/lanes"): Need.OPERATE,
    ("POST", "/admin/lanes/{name}"): Need.OPERATE,
    ("POST", "/admin/lanes/{name}/move"): Need.OPERATE,
    ("POST", "/admin/lanes/{name}/delete"): Need.OPERATE,
    ("POST", "/admin/tasks"): Need.OPERATE,
    ("POST", "/admin/tasks/{task}"): Need.OPERATE,
    ("POST", "/admin/tasks/{task}/delete"): Need.OPERATE,
    ("GET", "/admin/models"): Need.VIEW,
    ("POST", "/admin/models/fallbacks"): Need.OPERATE,
    ("POST", "/admin/models/price"): Need.OWN,
    ("GET", "/admin/models/alias"): Need.VIEW,
    ("GET", "/admin/models/replicas/panel"): Need.VIEW,
    ("POST", "/admin/models/replicas/add"): Need.OPERATE,
    ("POST", "/admin/models/replicas/swap"): Need.OPERATE,
    ("POST", "/admin/models/replicas/{action}"): Need.OPERATE,
    ("GET", "/admin/models/roles/panel"): Need.VIEW,
    ("POST", "/admin/models/roles/{action}"): Need.OPERATE,
    ("GET", "/admin/models/roles/compare"): Need.VIEW,
    ("GET", "/admin/batches"): Need.VIEW,
    ("GET", "/admin/batches/panel"): Need.VIEW,
    ("POST", "/admin/batches/{batch_id}/cancel"): Need.OPERATE,
    ("GET", "/admin/route"): Need.VIEW,
    ("POST", "/admin/route"): Need.VIEW,  # a dry run: nothing is changed or recorded
}


def rule_for(method: str, path_template: str) -> Need | None:
    """The route's rule; HEAD is GET's. None: the route has no rule (refused to everyone)."""
    method = "GET" if method == "HEAD" else method
    return ADMIN_RULES.get((method, path_template.rstrip("/") or "/"))
