"""Operator roles over HTTP: every admin route probed as owner, operator and viewer, and every
portal route as a tenant-owner, a tenant-member and a customer of another tenant. The routes
are enumerated from the running Litestar app; a route without a rule fails the probe."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from laneway.admin.roles import ADMIN_RULES, OPERATOR, OWNER, VIEWER, Need, allows
from laneway.portal.guards import PORTAL_ROLE_LEVEL, PORTAL_RULES, PortalNeed
from support import Gateway, ServerThread, start_gateway
from support.accounts import add_admin, add_portal_user, admin_api, portal_api

SIM = {"sim": [{"name": "sim-a", "engine_kind": "sim", "config": {"decode_ms_base": 0.2}}]}
MISSING = {"tenant_id": "999999", "key_id": "999999", "file_path": "admin.css", "batch_id": "batch_probe"}
LOGOUTS = {("POST", "/admin/api/logout"), ("POST", "/admin/logout")}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(
        tmp_path_factory.mktemp("roles"),
        seed_with={"models": SIM, "tenants": {"acme": {}, "globex": {}}},
    )
    for role in (OWNER, OPERATOR, VIEWER):
        add_admin(gw.database_url, f"an-{role}", role)
    add_portal_user(gw.database_url, "acme", "acme-owner", "tenant-owner")
    add_portal_user(gw.database_url, "acme", "acme-member", "tenant-member")
    add_portal_user(gw.database_url, "globex", "globex-owner", "tenant-owner")
    yield gw
    gw.stop()


def served_routes(server: ServerThread, prefix: str) -> list[tuple[str, str]]:
    return sorted(
        (method, route.path_format)
        for route in server.app.routes
        if route.path_format == prefix or route.path_format.startswith(prefix + "/")
        for method in getattr(route, "methods", ())
        if method not in ("OPTIONS", "HEAD")
    )


def url_of(template: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "probe-missing"), template)


def probe(client: httpx.Client, method: str, template: str, values: dict[str, str]) -> httpx.Response:
    """The route called with nothing it could act on: unknown ids, a body with an unknown field
    (JSON) or no fields but the CSRF token (forms)."""
    url = url_of(template, values)
    csrf = client.headers.get("X-CSRF-Token", "")
    if method == "GET":
        return client.get(url)
    if template.startswith(("/admin/api", "/portal/api")):
        return client.request(method, url, json={"probe_field": 1})
    return client.request(method, url, data={"csrf_token": csrf})


def page_client(base_url: str, api: httpx.Client) -> httpx.Client:
    """The same session for the pages (the cookie), the CSRF token kept for the forms."""
    client = httpx.Client(base_url=base_url, cookies=api.cookies, timeout=api.timeout)
    client.headers["X-CSRF-Token"] = api.headers["X-CSRF-Token"]
    return client


@pytest.mark.parametrize("role", [OWNER, OPERATOR, VIEWER])
def test_every_admin_route_as_each_role(gateway: Gateway, role: str) -> None:
    base = gateway.server.base_url
    api = admin_api(base, f"an-{role}")
    pages = page_client(base, api)
    wrong: list[str] = []
    for method, template in served_routes(gateway.server, "/admin"):
        need = ADMIN_RULES.get((method, template))
        if need is None:
            wrong.append(f"{method} {template}: no rule in admin/roles.py")
            continue
        if need == Need.PUBLIC or (method, template) in LOGOUTS:
            continue
        client = api if template.startswith("/admin/api") else pages
        path = template.removeprefix("/admin/api") if client is api else template
        r = probe(client, method, path, MISSING)
        refused = r.status_code == 403 and r.json()["error"]["code"] == "role_forbidden"
        if allows(role, need) == refused or r.status_code in (401, 500):
            wrong.append(f"{method} {template}: {r.status_code} {r.text[:120]}")
    assert wrong == []
    for client, path in ((api, "/logout"), (pages, "/admin/logout")):  # last: they end the session
        r = probe(client, "POST", path, {})
        assert r.status_code in (200, 303)


def test_a_refusal_is_audited_and_says_which_role_it_needs(gateway: Gateway) -> None:
    viewer = admin_api(gateway.server.base_url, f"an-{VIEWER}")
    r = viewer.post("/tenants", json={"name": "should-not-exist"})
    assert r.status_code == 403 and "operator" in r.json()["error"]["message"]
    owner = admin_api(gateway.server.base_url, f"an-{OWNER}")
    assert owner.get("/tenants", params={"q": "should-not-exist"}).json()["total"] == 0
    denials = [e for e in owner.get("/audit").json() if e["action"] == "deny" and e["actor"] == f"an-{VIEWER}"]
    assert denials and denials[0]["entity_id"] == "POST /admin/api/tenants"
    assert denials[0]["after"] == {"role": VIEWER, "needs": "operate"}
    assert viewer.get("/me").json() == {"username": f"an-{VIEWER}", "role": VIEWER, "can": ["view"]}


def test_an_operator_cannot_edit_prices_or_admins_but_an_owner_can(gateway: Gateway) -> None:
    base = gateway.server.base_url
    operator, owner = admin_api(base, f"an-{OPERATOR}"), admin_api(base, f"an-{OWNER}")
    price = {"input": "0.10", "output": "0.20"}
    assert operator.put("/models/sim/price", json=price).status_code == 403
    assert operator.post("/admins", json={"username": "x", "password": "p" * 12, "role": OWNER}).status_code == 403
    assert operator.patch(f"/tenants/{_tenant(owner, 'acme')}", json={"rpm": 100}).status_code == 200
    assert owner.put("/models/sim/price", json=price).status_code == 200
    made = owner.post("/admins", json={"username": "helpdesk", "password": "p" * 12, "role": VIEWER})
    assert made.status_code == 201 and made.json()["role"] == VIEWER
    assert owner.patch("/admins/helpdesk", json={"role": "root"}).status_code == 400
    assert owner.patch("/admins/helpdesk", json={"role": OPERATOR}).json()["role"] == OPERATOR


def test_bad_admin_names_and_roles_are_refused_and_nothing_is_made(gateway: Gateway) -> None:
    owner = admin_api(gateway.server.base_url, f"an-{OWNER}")
    for name in ("\u0430dmin", "ad\x00min", "a" * 10_000, "\uff52\uff4f\uff4f\uff54", "two words"):
        r = owner.post("/admins", json={"username": name, "password": "p" * 12, "role": VIEWER})
        assert r.status_code == 400 and r.json()["error"]["param"] == "username", name
    r = owner.post("/admins", json={"username": "fine", "password": "p" * 12, "role": "god"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "role"
    names = {a["username"] for a in owner.get("/admins").json()}
    assert "fine" not in names and not any(n.startswith(("\u0430", "a" * 100)) for n in names)


def _tenant(client: httpx.Client, name: str) -> int:
    return int(next(t["id"] for t in client.get("/tenants", params={"q": name}).json()["data"] if t["name"] == name))


def _globex_key(gateway: Gateway) -> str:
    owner = admin_api(gateway.server.base_url, f"an-{OWNER}")
    keys = owner.get(f"/tenants/{_tenant(owner, 'globex')}/keys").json()
    return str(keys["data"][0]["id"])


@pytest.mark.parametrize("user", ["acme-owner", "acme-member"])
def test_every_portal_route_as_each_portal_role(gateway: Gateway, user: str) -> None:
    """A key of another tenant is answered 404, as one that does not exist: the portal never
    says whether another tenant's id is real."""
    base = gateway.server.base_url
    api = portal_api(base, user)
    pages = page_client(base, api)
    role = "tenant-owner" if user.endswith("owner") else "tenant-member"
    others = {"key_id": _globex_key(gateway)}
    wrong: list[str] = []
    for method, template in served_routes(gateway.server, "/portal"):
        need = PORTAL_RULES.get((method, template))
        if need is None:
            wrong.append(f"{method} {template}: no rule in portal/guards.py")
            continue
        if need == PortalNeed.PUBLIC or template.endswith("/logout"):
            continue
        client = api if template.startswith("/portal/api") else pages
        path = template.removeprefix("/portal/api") if client is api else template
        r = probe(client, method, path, others)
        allowed = PORTAL_ROLE_LEVEL[role] >= need
        refused = r.status_code == 403 and r.json()["error"]["code"] == "role_forbidden"
        crossing = "{key_id}" in template
        if allowed == refused or r.status_code in (401, 500) or (allowed and crossing and r.status_code != 404):
            wrong.append(f"{method} {template}: {r.status_code} {r.text[:120]}")
    assert wrong == []


def test_sessions_do_not_cross_between_the_admin_and_the_portal(gateway: Gateway) -> None:
    base = gateway.server.base_url
    customer = portal_api(base, "acme-owner")
    assert httpx.get(base + "/admin/api/tenants", cookies=customer.cookies).status_code == 401
    admin = admin_api(base, f"an-{OWNER}")
    assert httpx.get(base + "/portal/api/keys", cookies=admin.cookies).status_code == 401
    r: Any = httpx.get(base + "/portal/keys", cookies=admin.cookies)
    assert r.status_code == 303 and r.headers["location"] == "/portal/login"


CHANGING_FORM = re.compile(r'<form[^>]*method="post"[^>]*action="(/admin/[^"]*)"')
NOT_A_CHANGE = {"/admin/logout", "/admin/route"}  # leaving, and the route tester's dry run


@pytest.mark.parametrize("role", [OWNER, OPERATOR, VIEWER])
def test_the_pages_show_a_role_only_the_forms_it_may_send(gateway: Gateway, role: str) -> None:
    base = gateway.server.base_url
    api = admin_api(base, f"an-{role}")
    acme = _tenant(api, "acme")
    api.post(f"/tenants/{acme}/keys", json={"name": "shown"})  # refused to the viewer; others see its forms
    pages = page_client(base, api)
    shown: set[str] = set()
    paths = ["/admin/tenants", f"/admin/tenants/{acme}", "/admin/policies", "/admin/models", "/admin/batches"]
    for path in [*paths, "/admin/models/alias?name=sim"]:
        r = pages.get(path)
        assert r.status_code == 200, path
        shown |= {re.sub(r"/\d+(/|$)", r"/N\1", a) for a in CHANGING_FORM.findall(r.text)} - NOT_A_CHANGE
    if role == VIEWER:  # the tenant's limits are shown in a disabled fieldset, without its Save button
        assert shown == {"/admin/tenants/N"}
        assert "disabled>\n  <legend>Limits" in pages.get(f"/admin/tenants/{acme}").text
    else:
        assert {"/admin/tenants", "/admin/tenants/N/keys", "/admin/lanes", "/admin/models/fallbacks"} <= shown
        assert ("/admin/models/price" in shown) == (role == OWNER)
