"""Bad admin input through the real server, on SQLite and on PostgreSQL (whose text cannot
hold NUL and whose INTEGER and OFFSET have limits): always a 4xx in OpenAI's error shape
naming the field, never a 500, and nothing changed. Also: PUTs set exactly the fields sent,
a model edit whose engine cannot start changes nothing, and tenants' lane grants."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from laneway.db.repositories import ModelRepository
from laneway.db.session import make_engine
from sqlalchemy import text
from support import PG_URL, Gateway, free_port, require_service, sim_model, start_gateway

PASSWORD = "correct horse battery"
LANES: list[dict[str, Any]] = [
    {"name": "batch", "priority": 2, "match_tasks": ["batch"], "max_concurrency": 2},
    {"name": "standard", "priority": 1},
]


async def _admin_sql(sql: str) -> None:
    engine = make_engine(PG_URL, isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        await conn.execute(text(sql))
    await engine.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    url = None
    if request.param == "postgres":
        require_service("PostgreSQL", "127.0.0.1", 5432)
        name = f"lw_edges_{uuid.uuid4().hex[:10]}"
        asyncio.run(_admin_sql(f'CREATE DATABASE "{name}"'))
        url = PG_URL.rsplit("/", 1)[0] + f"/{name}"
    seed = {
        "models": {"sim": sim_model("sim", decode_ms_base=0.2)},
        "lanes": LANES,
        "tasks": [{"task": "chat", "max_tokens": 64, "stop": ["###"]}],
        "tenants": {"acme": {}},
    }
    gw = start_gateway(
        tmp_path_factory.mktemp(request.param),
        database_url=url,
        seed_with=seed,
        admin_password=PASSWORD,
        auth_cache_ttl_s=30,
    )
    yield gw
    gw.stop()
    if url is not None:
        asyncio.run(_admin_sql(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def admin(gw: Gateway) -> Iterator[httpx.Client]:
    c = httpx.Client(base_url=gw.base_url + "/admin/api")
    r = c.post("/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200, r.text
    c.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    yield c
    c.close()


@pytest.fixture(scope="module")
def ui(gw: Gateway, admin: httpx.Client) -> Iterator[tuple[httpx.Client, str]]:
    """A browser-like client with a UI session (cookie) and its CSRF token."""
    c = httpx.Client(base_url=gw.base_url)
    page = c.get("/admin/login")
    form = {"csrf_token": _csrf(page.text), "username": "admin", "password": PASSWORD}
    assert c.post("/admin/login", data=form).status_code == 303
    yield c, _csrf(c.get("/admin/tenants").text)
    c.close()


def _csrf(html: str) -> str:
    return html.split('name="csrf_token" value="')[1].split('"')[0]


def refused(r: httpx.Response, param: str | None, code: str = "invalid_request", status: int = 400) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code), error
    assert "Expected `" not in error["message"] and "$." not in error["message"], error["message"]  # plain words
    return str(error["message"])


def tenant(admin: httpx.Client, name: str = "acme") -> dict[str, Any]:
    [found] = [t for t in admin.get("/tenants", params={"q": name}).json()["data"] if t["name"] == name]
    return found


def test_pages_out_of_range_are_400_in_the_api_and_clamped_in_the_ui(
    admin: httpx.Client, ui: tuple[httpx.Client, str]
) -> None:
    for params, param in [
        ({"page": str(10**20)}, "page"),
        ({"page": "0"}, "page"),
        ({"page": "-1"}, "page"),
        ({"page": "two"}, "page"),
        ({"per_page": "0"}, "per_page"),
        ({"per_page": "201"}, "per_page"),
        ({"per_page": "-5"}, "per_page"),
        ({"q": "a\x00b"}, "q"),
        ({"q": "\x1b[31m"}, "q"),
    ]:
        refused(admin.get("/tenants", params=params), param)
    ok = admin.get("/tenants", params={"page": "1000000", "per_page": "200"})
    assert ok.status_code == 200 and ok.json()["data"] == []
    assert admin.get("/tenants", params={"q": "ac%_"}).json()["total"] == 0  # LIKE wildcards are literal
    assert refused(admin.get("/audit", params={"limit": "0"}), "limit")

    browser, _ = ui
    for page in (str(10**20), "0", "-1", "x"):  # clamped: the first or the last page
        r = browser.get("/admin/tenants", params={"page": page})
        assert r.status_code == 200 and "acme" in r.text, page
    for params in ({"per_page": "0"}, {"per_page": "1000"}, {"q": "a\x00"}):
        r = browser.get("/admin/tenants", params=params)
        assert r.status_code == 400 and 'id="list-error"' in r.text, params
    assert browser.get("/admin/tenants", params={"per_page": "1"}).status_code == 200


def test_tenant_edits_refuse_bad_bodies_and_change_nothing(admin: httpx.Client, ui: tuple[httpx.Client, str]) -> None:
    before = tenant(admin)
    url = f"/tenants/{before['id']}"
    for body in (b"{not json", b"[1]", b'"rpm"', b"123", b"null", b'{"rpm": NaN}'):
        r = admin.patch(url, content=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["code"] in ("invalid_json", "invalid_request"), body
    for body, param in [
        ({"rmp": 5}, "rmp"),
        ({"rpm": 10**20}, "rpm"),
        ({"rpm": 0}, "rpm"),
        ({"weight": None}, "weight"),
        ({"name": "ac\x00me"}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 121}, "name"),
        ({"allowed_models": ["sim", "b\x00"]}, "allowed_models[1]"),
        ({"allowed_lanes": ["batch\n"]}, "allowed_lanes[0]"),
        ({"priority_floor": None}, "priority_floor"),
        ({"priority_floor": -5000}, "priority_floor"),
        ({"disabled": "yes"}, "disabled"),
    ]:
        refused(admin.patch(url, json=body), param)
    refused(admin.patch(url, content=b'{"weight": 1e400}'), "weight")
    refused(admin.post("/tenants", json={"name": "new\x00tenant"}), "name")
    refused(admin.post("/tenants", json={"name": "acme"}), "name", code="conflict", status=409)
    other = admin.post("/tenants", json={"name": "other-co"}).json()
    refused(admin.patch(f"/tenants/{other['id']}", json={"name": "acme"}), "name", code="conflict", status=409)
    assert tenant(admin) == before

    browser, csrf = ui
    r = browser.post("/admin/tenants", data={"csrf_token": csrf, "name": "bad\x00name"})
    assert r.status_code == 400 and "control characters" in r.text
    r = browser.post(f"/admin{url}", data={"csrf_token": csrf, "rpm": "ten", "weight": "1"})
    # Said next to the field, in the form's words (not the JSON field's).
    assert r.status_code == 400 and 'id="error-rpm"' in r.text and "Requests per minute must be" in r.text
    r = browser.post(f"/admin{url}", data={"csrf_token": csrf, "weight": "nan"})
    assert r.status_code == 400 and "Weight must be a number greater than 0" in r.text
    assert tenant(admin) == before


@pytest.mark.parametrize("raw", [b"NaN", b'"abc"', b"1e400", b"-1", b"0", b"Infinity", b"36501"])
def test_expires_days_must_be_a_number_of_days_above_zero(
    admin: httpx.Client, ui: tuple[httpx.Client, str], raw: bytes
) -> None:
    tid = tenant(admin)["id"]
    keys = len(admin.get(f"/tenants/{tid}/keys").json()["data"])
    r = admin.post(f"/tenants/{tid}/keys", content=b'{"name": "k", "expires_days": ' + raw + b"}")
    message = refused(r, "expires_days")
    assert message.startswith("expires_days must be a number of days greater than 0")
    browser, csrf = ui
    r = browser.post(
        f"/admin/tenants/{tid}/keys", data={"csrf_token": csrf, "name": "k", "expires_days": raw.decode().strip('"')}
    )
    assert r.status_code == 400 and 'id="key-error"' in r.text and "greater than 0" in r.text
    assert len(admin.get(f"/tenants/{tid}/keys").json()["data"]) == keys  # nothing issued


def test_key_names_and_a_valid_expiry(admin: httpx.Client) -> None:
    tid = tenant(admin)["id"]
    refused(admin.post(f"/tenants/{tid}/keys", json={"name": "ci\x00"}), "name")
    key = admin.post(f"/tenants/{tid}/keys", json={"name": "ci", "expires_days": 0.5}).json()
    assert key["expires_at"] is not None and key["secret"].startswith("lw-")


def test_a_put_sets_exactly_the_fields_it_names(gw: Gateway, admin: httpx.Client, ui: tuple[httpx.Client, str]) -> None:
    def lane(name: str) -> dict[str, Any]:
        return next(x for x in admin.get("/lanes").json() if x["name"] == name)

    before = lane("batch")
    assert admin.put("/lanes/batch", json={"max_concurrency": 3}).status_code == 200
    assert lane("batch") == {**before, "max_concurrency": 3}  # the match rule is still there
    assert gw.server.runtime.policies.current.lane("batch").max_concurrency == 3
    cleared = admin.put("/lanes/batch", json={"max_concurrency": None})  # null: no cap, the learned limit's
    assert cleared.status_code == 200 and cleared.json()["max_concurrency"] is None
    assert admin.put("/lanes/batch", json={"max_concurrency": 3}).status_code == 200
    refused(admin.put("/lanes/batch", content=b"[]"), None, code="invalid_json")
    refused(admin.put("/lanes/batch", json={"match_taks": ["x"]}), "match_taks")
    refused(admin.put("/lanes/batch", json={"position": 2**40}), "position")
    assert lane("batch") == {**before, "max_concurrency": 3}
    for path, param in (("/lanes/a%00b", "name"), ("/lanes/" + "l" * 61, "name"), ("/tasks/t%01", "task")):
        refused(admin.put(path, json={"max_concurrency": 2} if "lanes" in path else {"max_tokens": 5}), param)
    assert admin.put("/tasks/chat", json={"max_tokens": 50}).json()["stop"] == ["###"]
    assert admin.put("/tasks/chat", json={"stop": None}).json() == {
        **admin.put("/tasks/chat", json={}).json(),
        "stop": [],
    }

    # The UI form sends every field: an emptied rule clears it; an emptied limit is refused.
    browser, csrf = ui
    form = {"csrf_token": csrf, **{k: _form_value(v) for k, v in lane("batch").items() if k != "name"}}
    r = browser.post("/admin/lanes/batch", data={**form, "match_tasks": ""})
    assert r.status_code == 200 and "Saved batch" in r.text
    assert lane("batch") == {**before, "max_concurrency": 3, "match_tasks": None}
    r = browser.post("/admin/lanes/batch", data={**form, "max_queue_depth": ""})
    assert r.status_code == 400 and "max_queue_depth cannot be cleared" in r.text
    r = browser.post("/admin/lanes/batch", data={**form, "max_concurrency": "0"})
    assert r.status_code == 400 and "max_concurrency must be a whole number, at least 1" in r.text
    assert browser.post("/admin/lanes/batch", data=form).status_code == 200  # back as it was
    assert lane("batch") == {**before, "max_concurrency": 3}


def _form_value(v: Any) -> str:
    """A lane field as the policy form shows it."""
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(v)
    return str(v).lower() if isinstance(v, bool) else str(v)


def test_nul_in_names_is_refused_everywhere(gw: Gateway, admin: httpx.Client) -> None:
    refused(admin.put("/models/si%00m", json={"deployments": []}), "alias")
    refused(
        admin.put("/models/sim", json={"deployments": [{"name": "a\x00", "engine_kind": "sim"}]}), "deployments[0].name"
    )
    refused(
        admin.put("/models/sim", json={"deployments": [{"name": "a", "engine_kind": "sim", "gpu_type": "\x00"}]}),
        "deployments[0].gpu_type",
    )
    refused(httpx.post(gw.base_url + "/admin/api/login", json={"username": "\x00", "password": PASSWORD}), "username")


def _model_rows(gw: Gateway) -> list[Any]:
    async def read() -> list[Any]:
        async with gw.server.runtime.sessions() as s:
            return [(d.name, d.engine_kind, d.config) for d in (await ModelRepository(s).get("sim")).deployments]

    return list(gw.server.call(read()))


@pytest.mark.parametrize(
    ("deployment", "param", "reason"),
    [
        ({"name": "bad", "engine_kind": "nope"}, "deployments[0].engine_kind", "Unknown engine kind 'nope'"),
        ({"name": "bad", "engine_kind": "llamacpp"}, "deployments[0]", "needs config key 'model_path'"),
        (
            {"name": "bad", "engine_kind": "llamacpp", "config": {"model_path": "/nonexistent/model.gguf"}},
            "deployments[0]",
            "model file not found",
        ),
        (
            {"name": "bad", "engine_kind": "vllm", "config": {"base_url": "http://127.0.0.1:{port}"}},
            "deployments[0]",
            "is not healthy",
        ),
        ({"name": "bad", "engine_kind": "sim", "config": {"max_concurrency": "many"}}, "deployments[0]", "many"),
    ],
)
def test_a_model_whose_engine_cannot_start_changes_nothing(
    gw: Gateway, admin: httpx.Client, ui: tuple[httpx.Client, str], deployment: dict[str, Any], param: str, reason: str
) -> None:
    deployment = {
        **deployment,
        "config": {k: str(v).replace("{port}", str(free_port())) for k, v in deployment.get("config", {}).items()},
    }
    registry = gw.gateway.registry
    serving = registry.resolve("sim")
    rows = _model_rows(gw)
    body = {"deployments": [{"name": "sim-ok", "engine_kind": "sim"}, deployment]}
    r = admin.put("/models/sim", json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param.replace("[0]", "[1]") and reason in error["message"], error
    browser, csrf = ui  # the alias page's typed form of the engine kind, one input per config key
    form = {
        "csrf_token": csrf,
        "alias": "sim",
        "name": deployment["name"],
        "kind": deployment["engine_kind"],
        "max_model_len": "2048",
        **{f"config.{k}": v for k, v in deployment.get("config", {}).items()},
    }
    r = browser.post("/admin/models/replicas/add", data=form)
    assert r.status_code == 400 and reason.replace("'", "&#39;") in r.text, r.text
    assert _model_rows(gw) == rows  # the database
    assert registry.resolve("sim") is serving  # the engines
    assert not registry.failed and not registry.rejected
    assert httpx.get(gw.base_url + "/health/ready").status_code == 200
    chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert (
        httpx.post(
            gw.api_url + "/chat/completions", json=chat, headers={"Authorization": f"Bearer {gw.keys['acme']}"}
        ).status_code
        == 200
    )


def test_a_good_model_edit_starts_its_engines_once(gw: Gateway, admin: httpx.Client) -> None:
    registry = gw.gateway.registry
    refused(
        admin.put("/models/other", json={"deployments": [{"name": "sim-sim", "engine_kind": "sim"}]}),
        "deployments[0].name",
        code="conflict",
        status=409,
    )
    refused(
        admin.put("/models/sim", json={"deployments": [{"name": "a", "engine_kind": "sim"}] * 2}), "deployments[1].name"
    )
    r = admin.put(
        "/models/sim", json={"deployments": [{"name": "sim-b", "engine_kind": "sim", "config": {"max_concurrency": 3}}]}
    )
    assert r.status_code == 200 and r.json()["deployments"] == ["sim-b"]
    installed = registry.resolve("sim")

    async def resync() -> list[str]:
        async with gw.server.runtime.sessions() as s:
            return list(await registry.sync(await ModelRepository(s).enabled_deployments()))

    assert gw.server.call(resync()) == []  # the database's rows equal what was installed: no restart
    assert registry.resolve("sim") is installed and installed.engine.info.max_concurrency == 3


def test_a_tenant_picks_a_lane_only_once_granted(
    gw: Gateway, admin: httpx.Client, ui: tuple[httpx.Client, str]
) -> None:
    api = httpx.Client(base_url=gw.api_url, headers={"Authorization": f"Bearer {gw.keys['acme']}"})
    chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert api.post("/chat/completions", json=chat).headers["x-laneway-lane"] == "standard"  # cached from now on
    r = api.post("/chat/completions", json=chat, headers={"X-Laneway-Lane": "batch"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "lane_not_allowed"
    acme = tenant(admin)
    edited = admin.patch(f"/tenants/{acme['id']}", json={"allowed_lanes": ["batch"], "priority_floor": 3}).json()
    assert (edited["allowed_lanes"], edited["priority_floor"]) == (["batch"], 3)
    r = api.post("/chat/completions", json=chat, headers={"X-Laneway-Lane": "batch"})  # the cache was dropped
    assert r.status_code == 200 and r.headers["x-laneway-lane"] == "batch"
    entry = next(e for e in admin.get("/audit").json() if e["entity"] == "tenant" and e["after"]["allowed_lanes"])
    assert entry["before"]["allowed_lanes"] is None and entry["after"]["priority_floor"] == 3

    browser, csrf = ui
    page = browser.get(f"/admin/tenants/{acme['id']}")
    assert 'name="allowed_lanes"' in page.text and 'value="batch"' in page.text and 'id="grants-help"' in page.text
    r = browser.post(
        f"/admin/tenants/{acme['id']}",
        data={"csrf_token": csrf, "weight": "1", "allowed_lanes": "", "priority_floor": ""},
    )
    assert r.status_code == 200 and "Saved" in r.text
    assert (tenant(admin)["allowed_lanes"], tenant(admin)["priority_floor"]) == (None, 0)
    r = api.post("/chat/completions", json=chat, headers={"X-Laneway-Lane": "batch"})
    assert r.status_code == 403
    api.close()
