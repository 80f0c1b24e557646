"""GET /admin/api/usage (OpenAI's organization usage shape, from the rollups) and a tenant's keys in
cursor pages (GET /admin/api/tenants/{id}/keys and the tenant page), through the real server
with rows that real requests wrote (the openai SDK over loopback)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support import Gateway, sim_model, start_gateway

PASSWORD = "usage api password"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(
        tmp_path_factory.mktemp("usage-api"),
        admin_password=PASSWORD,
        seed_with={
            "models": {"sim": sim_model("sim"), "sim2": sim_model("sim2")},
            "tenants": {"acme": {}, "other": {}},
        },
    )
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def admin(gateway: Gateway) -> Iterator[httpx.Client]:
    client = httpx.Client(base_url=gateway.base_url + "/admin/api", timeout=30)
    r = client.post("/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200
    client.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    yield client
    client.close()


def _send(gw: Gateway) -> int:
    acme = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    for model, n in (("sim", 3), ("sim2", 2)):
        for i in range(n):
            acme.chat.completions.create(model=model, messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=4)
    openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["other"], max_retries=0).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "not acme's"}], max_tokens=2
    )
    return gw.usage_rows("acme")[0].tenant_id  # type: ignore[no-any-return]


def test_usage_api_buckets_groups_and_pages(gateway: Gateway, admin: httpx.Client) -> None:
    tenant_id = _send(gateway)
    rows = gateway.usage_rows("acme")
    now = int(time.time())
    day = admin.get("/usage", params={"start_time": now - 3 * 86400, "tenant_id": tenant_id, "group_by": "model"})
    assert day.status_code == 200, day.text
    page = day.json()
    assert page["object"] == "page" and page["has_more"] is False and page["next_page"] is None
    assert [b["end_time"] - b["start_time"] for b in page["data"]] == [86400] * 4  # every day, empty ones too
    results = [r for b in page["data"] for r in b["results"]]
    assert {r["model"]: r["num_model_requests"] for r in results} == {"sim": 3, "sim2": 2}
    assert sum(r["input_tokens"] for r in results) == sum(r.prompt_tokens for r in rows)
    assert sum(r["output_tokens"] for r in results) == sum(r.completion_tokens for r in rows)
    assert all(r["object"] == "usage.result" and r["tenant_id"] == tenant_id for r in results)

    # Every tenant, by the minute, two buckets a page: the cursor walks to the end.
    seen, params = 0, {"start_time": now - 240, "end_time": now + 60, "bucket_width": "1m", "limit": 2}
    pages = 0
    while True:
        got = admin.get("/usage", params=params).json()
        pages += 1
        assert len(got["data"]) <= 2
        seen += sum(r["num_model_requests"] for b in got["data"] for r in b["results"])
        if not got["has_more"]:
            break
        params = {**params, "page": got["next_page"]}
    assert pages == 3 and seen == 6  # acme's five and other's one

    by_key = admin.get("/usage", params={"start_time": now - 3600, "bucket_width": "1h", "group_by": ["key", "lane"]})
    keyed = [r for b in by_key.json()["data"] for r in b["results"]]
    assert {r["api_key_id"] for r in keyed} == {r.api_key_id for r in rows} | {
        r.api_key_id for r in gateway.usage_rows("other")
    }


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({}, "start_time"),
        ({"start_time": "yesterday"}, "start_time"),
        ({"start_time": 100, "end_time": 50}, "end_time"),
        ({"start_time": 100, "bucket_width": "1w"}, "bucket_width"),
        ({"start_time": 100, "group_by": "project"}, "group_by"),
        ({"start_time": 100, "bucket_width": "1h", "limit": 169}, "limit"),
        ({"start_time": 100, "page": "page_7"}, "page"),
        ({"start_time": 100, "tenant_id": "acme"}, "tenant_id"),
        ({"start_time": 100, "colour": "red"}, "colour"),
    ],
)
def test_bad_usage_parameters_are_400_naming_them(admin: httpx.Client, params: dict[str, object], param: str) -> None:
    r = admin.get("/usage", params=params)  # type: ignore[arg-type]
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_a_tenants_keys_come_in_cursor_pages_searched_in_the_database(gateway: Gateway, admin: httpx.Client) -> None:
    tenant = admin.post("/tenants", json={"name": "many-keys"}).json()
    for i in range(7):
        assert admin.post(f"/tenants/{tenant['id']}/keys", json={"name": f"svc-{i % 2}-{i}"}).status_code == 201
    ids, after = [], None
    while True:
        params = {"limit": 3, **({"after": after} if after else {})}
        page = admin.get(f"/tenants/{tenant['id']}/keys", params=params).json()
        assert page["object"] == "list" and len(page["data"]) <= 3
        ids += [k["id"] for k in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert len(ids) == 7 and ids == sorted(ids)
    found = admin.get(f"/tenants/{tenant['id']}/keys", params={"q": "SVC-1"}).json()["data"]
    assert [k["name"] for k in found] == ["svc-1-1", "svc-1-3", "svc-1-5"]
    assert admin.get(f"/tenants/{tenant['id']}/keys", params={"limit": 0}).json()["error"]["param"] == "limit"
    assert admin.get("/tenants/999999/keys").status_code == 404

    pages = httpx.Client(base_url=gateway.base_url, timeout=30, cookies=admin.cookies)
    html = pages.get(f"/admin/tenants/{tenant['id']}").text
    assert len(re.findall(r'<tr id="key-\d+"', html)) == 7 and 'id="keys-next"' not in html
    html = pages.get(f"/admin/tenants/{tenant['id']}", params={"keys_q": "svc-0"}).text
    assert len(re.findall(r'<tr id="key-\d+"', html)) == 4
    html = pages.get(f"/admin/tenants/{tenant['id']}", params={"keys_after": ids[5]}).text
    assert re.findall(r'<tr id="key-(\d+)"', html) == [str(ids[6])]


def test_usage_api_needs_a_session(gateway: Gateway, tmp_path: Path) -> None:
    assert httpx.get(gateway.base_url + "/admin/api/usage", params={"start_time": 0}).status_code == 401
