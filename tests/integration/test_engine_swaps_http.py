"""Engine swaps over HTTP, with the official SDK as the client: roles set through the admin API
(refusals name the field and change nothing; changes audited and live at once), sessions
split between the serving pool and the canary by weight and kept on one engine, a canary
failing a third of its requests rolled back by laneway with no client seeing an error, a
shadow's copies compared and never answered, and the alias page's panel and Compare view."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from laneway.engines.base import EngineError
from laneway.types import Delta, GenerationRequest
from support import EXE, Gateway, start_gateway, wait_for

PASSWORD = "correct horse battery"
SIM = {"max_concurrency": 4, "decode_ms_base": 2.0}


def sim(name: str, **role: Any) -> dict[str, Any]:
    return {
        "name": name,
        "engine_kind": "sim",
        "quantization": "sim",
        "gpu_type": "sim",
        "max_model_len": 8192,
        "config": SIM,
        **role,
    }


def start(tmp_path: Path, models: dict[str, list[dict[str, Any]]], **settings: Any) -> Gateway:
    seed = {"models": models, "tenants": {"acme": {}}}
    return start_gateway(
        tmp_path, seed_with=seed, admin_password=PASSWORD, usage_flush_interval_s=0.05, metrics_token="t", **settings
    )


def admin_api(gw: Gateway) -> httpx.Client:
    api = httpx.Client(base_url=gw.base_url + "/admin/api")
    csrf = api.post("/login", json={"username": "admin", "password": PASSWORD}).json()["csrf_token"]
    api.headers["X-CSRF-Token"] = csrf
    return api


def roles(api: httpx.Client, alias: str = "m") -> dict[str, tuple[str, float, float]]:
    found = api.get(f"/models/{alias}/compare").json()["deployments"]
    return {d["name"]: (d["role"], d["weight"], d["sample"]) for d in found}


def ask(gw: Gateway, n: int, user: str | None = None, start_at: int = 0, **extra: Any) -> list[str]:
    """n chats with the SDK (a new conversation each unless `user` names one); the ids answered."""
    client = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    ids = []
    for i in range(start_at, start_at + n):
        body: dict[str, Any] = {"user": user} if user else {}
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"conversation {i}"}], max_tokens=3, **body, **extra
        )
        ids.append(answer.id)
    return ids


def served_by(gw: Gateway, ids: list[str]) -> dict[str, str]:
    rows = {r.request_id: r for r in gw.usage_rows("acme")}
    return {i: rows[i].deployment for i in ids if i in rows}


def rows_for(gw: Gateway, ids: list[str]) -> dict[str, str]:
    """Request id -> the deployment its usage row names, once every one has its row."""
    wait_for(lambda: len(served_by(gw, ids)) == len(ids), what=f"{len(ids)} usage rows")
    return served_by(gw, ids)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = start(tmp_path, {"m": [sim("m-a"), sim("m-b"), sim("m-c")], "solo": [sim("solo-a")]})
    yield gateway
    gateway.stop()


def test_roles_are_set_through_the_api_and_bad_ones_refused_naming_the_field(gw: Gateway) -> None:
    api = admin_api(gw)
    before = roles(api)
    assert set(before.values()) == {("serving", 0.0, 0.0)}
    refusals = [
        ("m", "m-b", {"role": "canary", "weight": 101}, "weight"),
        ("m", "m-b", {"role": "canary", "weight": -1}, "weight"),
        ("m", "m-b", {"role": "canary", "weight": "nan"}, "weight"),
        ("m", "m-c", {"role": "shadow", "sample": -0.5}, "sample"),
        ("m", "m-b", {"role": "blue"}, "role"),
        ("solo", "solo-a", {"role": "canary", "weight": 10}, "role"),  # a canary on an alias with one deployment
    ]
    for alias, name, body, field in refusals:
        answer = api.patch(f"/models/{alias}/replicas/{name}/role", json=body)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["param"] == field, answer.json()
    assert api.patch("/models/m/replicas/m-c/role", json={"role": "shadow", "sample": 25}).status_code == 200
    second = api.patch("/models/m/replicas/m-b/role", json={"role": "shadow", "sample": 5})
    assert second.status_code == 400 and second.json()["error"]["param"] == "role"
    assert roles(api) == {**before, "m-c": ("shadow", 0.0, 25.0)}  # only the accepted change
    done = api.patch("/models/m/replicas/m-b/role", json={"role": "canary", "weight": 10})
    assert done.json() == {"alias": "m", "name": "m-b", "role": "canary", "weight": 10.0, "sample": 0.0}
    assert roles(api)["m-b"] == ("canary", 10.0, 0.0)  # live at once
    audit = [e for e in api.get("/audit").json() if e["entity"] == "deployment"]
    assert [(e["entity_id"], e["after"]["role"]) for e in audit][:2] == [("m-b", "canary"), ("m-c", "shadow")]
    rolled = api.post("/models/m/replicas/m-b/rollback")
    assert rolled.status_code == 200 and roles(api)["m-b"] == ("canary", 0.0, 0.0)


def test_sessions_split_by_weight_and_a_conversation_stays_on_one_engine(gw: Gateway) -> None:
    api = admin_api(gw)
    api.patch("/models/m/replicas/m-b/role", json={"role": "canary", "weight": 30})
    api.patch("/models/m/replicas/m-c/role", json={"role": "shadow", "sample": 0})
    ids = ask(gw, 60)
    served = rows_for(gw, ids)
    assert set(served.values()) == {"m-a", "m-b"}  # never the shadow
    assert 6 <= list(served.values()).count("m-b") <= 30
    for user in ("alice", "bob", "carol", "dave"):  # each user's turns: one engine
        ids = ask(gw, 4, user=user)
        engines = rows_for(gw, ids)
        assert len(set(engines.values())) == 1


def failing_every_third(engine: Any) -> None:
    """The canary answers 500 (an engine error before the first byte) to a third of its requests."""
    generate, count = engine.generate, itertools.count()

    async def refused(request: GenerationRequest) -> AsyncGenerator[Delta, None]:
        raise EngineError("upstream answered 500")
        yield Delta("")  # pragma: no cover - makes this a generator

    engine.generate = lambda request: refused(request) if next(count) % 3 == 0 else generate(request)


def test_a_canary_failing_a_third_of_its_requests_is_rolled_back_and_no_client_sees_it(tmp_path: Path) -> None:
    gw = start(tmp_path, {"m": [sim("m-a"), sim("m-b", role="canary", weight=50.0)]}, canary_min_requests=10)
    try:
        canary = next(d for d in gw.gateway.registry.replicas("m") if d.spec.name == "m-b")
        failing_every_third(canary.engine)
        ids = ask(gw, 80)  # the SDK raises on any error answer: every one of these got a 200
        served = rows_for(gw, ids)
        assert canary.weight == 0.0
        api = admin_api(gw)
        wait_for(lambda: roles(api)["m-b"] == ("canary", 0.0, 0.0), what="the rollback")
        audit = [e for e in api.get("/audit").json() if e["action"] == "rollback"]
        assert audit and audit[0]["actor"] == "laneway (error_rate)" and audit[0]["after"]["weight"] == 0.0
        rows = {r.request_id: r for r in gw.usage_rows("acme")}
        moved = [i for i in ids if rows[i].tries > 1]
        assert moved and all(served[i] == "m-a" for i in moved)  # failed over to the serving pool
        late = ask(gw, 20, start_at=1000)
        assert set(rows_for(gw, late).values()) == {"m-a"}
        metrics = httpx.get(gw.base_url + "/metrics", headers={"Authorization": "Bearer t"}).text
        assert 'laneway_canary_rollbacks_total{deployment="m-b",model="m",reason="error_rate"} 1.0' in metrics
        assert 'laneway_pool_requests_total{deployment="m-b",model="m",outcome="engine_error",role="canary"}' in metrics
    finally:
        gw.stop()


def test_a_shadow_gets_copies_compared_with_the_served_answers_and_the_page_shows_them(gw: Gateway) -> None:
    api = admin_api(gw)
    api.patch("/models/m/replicas/m-c/role", json={"role": "shadow", "sample": 100})
    ids = ask(gw, 6, temperature=0)
    served = rows_for(gw, ids)
    assert "m-c" not in served.values()  # never answered, never billed
    wait_for(lambda: api.get("/models/m/compare").json()["shadow"]["compared"] == 6, what="6 copies compared")
    report = api.get("/models/m/compare").json()["shadow"]
    assert report["exact_match_rate"] == 1.0 and report["greedy"] == 6 and report["ttft_samples"] == 6
    pages = httpx.Client(base_url=gw.base_url + "/admin", cookies=api.cookies)
    panel = pages.get("/models/roles/panel", params={"name": "m"})
    assert panel.status_code == 200 and 'id="role-m-c" data-role="shadow"' in panel.text
    compare = pages.get("/models/roles/compare", params={"name": "m"}).text
    assert "Exact match at temperature 0" in compare and "100.0 % of 6" in compare
    alias_page = pages.get("/models/alias", params={"name": "m"}).text
    assert "/admin/models/roles/panel?name=m" in alias_page


def test_the_cli_sets_a_role_a_running_gateway_applies_and_refuses_a_bad_weight(
    pg_database: str, tmp_path: Path
) -> None:
    seed = {"models": {"m": [sim("m-a"), sim("m-b")]}, "tenants": {"acme": {}}}
    gw = start_gateway(tmp_path / "gw", database_url=pg_database, policy_poll_interval_s=3600, seed_with=seed)
    env = {**os.environ, "LANEWAY_DATA_DIR": str(tmp_path / "cli"), "LANEWAY_DATABASE_URL": pg_database}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, "model", "replica", *args], env=env, capture_output=True, text=True, timeout=120)

    try:
        wait_for(lambda: gw.server.runtime.config_changes.connected, what="the gateway's LISTEN")
        done = run("set", "m", "m-b", "--role", "canary", "--weight", "10")
        assert done.returncode == 0 and done.stdout.strip() == "m-b of m: canary, weight 10 %"
        canary = next(d for d in gw.gateway.registry.replicas("m") if d.spec.name == "m-b")
        wait_for(lambda: (canary.role, canary.weight) == ("canary", 10.0), within=20, what="the NOTIFY")
        refused = run("set", "m", "m-b", "--role", "canary", "--weight", "150")
        assert refused.returncode != 0 and "weight" in refused.stderr
        assert run("list", "m").stdout.splitlines()[1].endswith("\tcanary, weight 10 %")
        assert canary.weight == 10.0  # the refusal changed nothing
    finally:
        gw.stop()
