"""The JSON admin API through the real server: login, CSRF, and edits that take effect on
the running gateway (no restart), each one audited."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support import ServerThread, start_gateway

PASSWORD = "correct horse battery"


SIM = {"sim": [{"name": "sim-a", "engine_kind": "sim", "config": {"decode_ms_base": 0.2}}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    gw = start_gateway(tmp_path_factory.mktemp("admin"), seed_with={"models": SIM}, admin_password=PASSWORD)
    yield gw.server
    gw.stop()


@pytest.fixture
def admin(server: ServerThread) -> Iterator[httpx.Client]:
    client = httpx.Client(base_url=server.base_url + "/admin/api")
    r = client.post("/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/admin" in cookie
    client.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    yield client
    client.close()


def test_login_is_required_and_wrong_passwords_are_refused(server: ServerThread) -> None:
    anon = httpx.Client(base_url=server.base_url + "/admin/api")
    assert anon.get("/tenants").status_code == 401
    for user, password in (("admin", "wrong password"), ("nobody", PASSWORD)):
        r = anon.post("/login", json={"username": user, "password": password})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_credentials"


def test_changes_need_the_csrf_token(admin: httpx.Client) -> None:
    r = admin.post("/tenants", json={"name": "csrf-test"}, headers={"X-CSRF-Token": "forged"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
    assert admin.get("/tenants", params={"q": "csrf-test"}).json()["total"] == 0


def test_edits_apply_to_the_running_gateway_and_are_audited(server: ServerThread, admin: httpx.Client) -> None:
    tenant = admin.post("/tenants", json={"name": "acme", "rpm": 100}).json()
    assert admin.post("/tenants", json={"name": "acme"}).status_code == 409
    key = admin.post(f"/tenants/{tenant['id']}/keys", json={"name": "ci"}).json()
    assert (
        key["secret"].startswith("lw-") and "secret" not in admin.get(f"/tenants/{tenant['id']}/keys").json()["data"][0]
    )
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key["secret"], max_retries=0)

    def ask(**kw: Any) -> Any:
        return client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], **kw)

    ask(max_tokens=2)
    # Lower the tenant's RPM to 1: the very next request is refused, no restart.
    assert admin.patch(f"/tenants/{tenant['id']}", json={"rpm": 1}).json()["rpm"] == 1
    ask(max_tokens=2)  # a fresh bucket at the new capacity holds one
    with pytest.raises(openai.RateLimitError):
        ask(max_tokens=2)
    admin.patch(f"/tenants/{tenant['id']}", json={"rpm": None})  # null clears the limit
    ask(max_tokens=2)

    # A task policy edit caps max_tokens at once.
    assert admin.put("/tasks/chat", json={"max_tokens": 7}).status_code == 200
    assert ask(max_tokens=500).usage.completion_tokens == 7
    # A lane edit reroutes at once.
    admin.put("/lanes/everything", json={"position": 0, "max_concurrency": 2})
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert raw.headers["x-laneway-lane"] == "everything"
    # Swapping the engine behind the alias.
    swapped = admin.put("/models/sim", json={"deployments": [{"name": "sim-b", "engine_kind": "sim"}]}).json()
    assert swapped["deployments"] == ["sim-b"]
    assert ask(max_tokens=2).usage.completion_tokens == 2
    # Revoking the key locks it out.
    admin.delete(f"/keys/{key['id']}")
    with pytest.raises(openai.AuthenticationError):
        ask(max_tokens=2)

    audit = admin.get("/audit").json()
    actions = [(e["action"], e["entity"]) for e in audit]
    for expected in [
        ("create", "tenant"),
        ("issue", "api_key"),
        ("update", "tenant"),
        ("create", "task"),
        ("create", "lane"),
        ("update", "model"),
        ("revoke", "api_key"),
    ]:
        assert expected in actions, expected
    rpm_change = next(e for e in audit if e["entity"] == "tenant" and e["before"] and e["before"]["rpm"] == 100)
    assert rpm_change["after"]["rpm"] == 1 and rpm_change["actor"] == "admin"


def test_validation_errors_name_the_field(admin: httpx.Client) -> None:
    r = admin.put("/lanes/bad", json={"max_concurrency": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_concurrency"


def test_logout_ends_the_session(server: ServerThread) -> None:
    c = httpx.Client(base_url=server.base_url + "/admin/api")
    csrf = c.post("/login", json={"username": "admin", "password": PASSWORD}).json()["csrf_token"]
    assert c.post("/logout", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert c.get("/tenants").status_code == 401
