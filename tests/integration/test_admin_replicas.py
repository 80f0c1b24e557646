"""An alias's replicas managed one at a time through the admin service (the alias page's typed
form and the JSON API alike): add, drain and resume, disable and enable, swap the engine,
remove; each audited and applied at once, a refused one changing nothing, and a drain reaching
another gateway replica by NOTIFY without restarting its engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from laneway.app import create_app
from standins.vllm_server import VLLMStandIn
from support import Gateway, ServerThread, free_port, in_process_settings, seed, sim_model, start_gateway, wait_for

PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    seed = {
        "models": {"m": sim_model("m", max_concurrency=4)},
        "lanes": [{"name": "standard"}],
        "tenants": {"acme": {}},
    }
    gateway = start_gateway(tmp_path_factory.mktemp("replicas"), seed_with=seed, admin_password=PASSWORD)
    yield gateway
    gateway.stop()


def logged_in(base_url: str) -> tuple[httpx.Client, httpx.Client, str]:
    """(the JSON API, the pages, the CSRF token) of one admin session."""
    api = httpx.Client(base_url=base_url + "/admin/api")
    csrf = api.post("/login", json={"username": "admin", "password": PASSWORD}).json()["csrf_token"]
    api.headers["X-CSRF-Token"] = csrf
    return api, httpx.Client(base_url=base_url + "/admin", cookies=api.cookies), csrf


@pytest.fixture(scope="module")
def admin(gw: Gateway) -> tuple[httpx.Client, httpx.Client, str]:
    return logged_in(gw.base_url)


def ask(gw: Gateway) -> int:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(
        gw.api_url + "/chat/completions", json=chat, headers={"Authorization": f"Bearer {gw.keys['acme']}"}
    ).status_code


def served(gw: Gateway) -> dict[str, Any]:
    return {d.spec.name: d for d in gw.gateway.registry.replicas("m")}


def test_a_replica_is_added_by_its_engines_typed_form_and_one_that_cannot_start_is_refused(
    gw: Gateway, admin: tuple[httpx.Client, httpx.Client, str], vllm: VLLMStandIn
) -> None:
    api, page, csrf = admin
    form = {
        "csrf_token": csrf,
        "alias": "m",
        "kind": "vllm",
        "name": "m-vllm",
        "config.base_url": vllm.base_url,
        "config.model": "m",
        "config.metrics_poll_s": "0.05",
        "config.max_concurrency": "3",
    }
    dead = {**form, "name": "m-dead", "config.base_url": f"http://127.0.0.1:{free_port()}"}
    r = page.post("/models/replicas/add", data=dead)
    assert r.status_code == 400 and 'id="error-config-base_url"' in r.text and "is not healthy" in r.text
    assert sorted(served(gw)) == ["m-sim"] and ask(gw) == 200  # nothing changed; the alias serves
    r = page.post("/models/replicas/add", data={**form, "config.metrics_poll_s": "often"})
    assert r.status_code == 400 and "vllm config: metrics_poll_s" in r.text  # the engine's own words
    r = page.post("/models/replicas/add", data=form)
    assert r.status_code == 200 and "Added m-vllm (vllm)." in r.text, r.text
    config = served(gw)["m-vllm"].spec.config  # typed by the engine's struct: numbers are numbers
    assert {k: config[k] for k in ("base_url", "model", "metrics_poll_s", "max_concurrency")} == {
        "base_url": vllm.base_url,
        "model": "m",
        "metrics_poll_s": 0.05,
        "max_concurrency": 3,
    }
    assert "m-vllm" in gw.gateway.registry.warm
    assert 'id="replica-m-vllm" data-state="warm" data-health="healthy"' in r.text
    entry = api.get("/audit", params={"limit": 1}).json()[0]
    assert (entry["action"], entry["entity"], entry["entity_id"]) == ("update", "model", "m")
    assert [d["name"] for d in entry["after"]["deployments"]] == ["m-sim", "m-vllm"]


def test_drain_resume_disable_enable_and_their_refusals(
    gw: Gateway, admin: tuple[httpx.Client, httpx.Client, str]
) -> None:
    api, page, csrf = admin
    r = page.post("/models/replicas/drain", data={"csrf_token": csrf, "alias": "m", "name": "m-vllm"})
    assert r.status_code == 200 and served(gw)["m-vllm"].draining and "drained: nothing running" in r.text
    engine = served(gw)["m-vllm"].engine
    assert api.patch("/models/m/replicas/m-sim", json={"draining": True}).status_code == 409  # the last taking any
    assert [ask(gw) for _ in range(4)] == [200] * 4 and served(gw)["m-vllm"].engine is engine  # not restarted
    assert api.patch("/models/m/replicas/m-vllm", json={"draining": False}).json()["draining"] is False
    assert not served(gw)["m-vllm"].draining
    assert api.get("/audit", params={"limit": 1}).json()[0]["after"] == {"draining": False}
    r = page.post("/models/replicas/disable", data={"csrf_token": csrf, "alias": "m", "name": "m-vllm"})
    assert r.status_code == 200 and sorted(served(gw)) == ["m-sim"] and 'data-state="disabled"' in r.text
    r = api.patch("/models/m/replicas/m-sim", json={"enabled": False})
    assert r.status_code == 409 and "last enabled replica" in r.json()["error"]["message"]
    assert api.patch("/models/m/replicas/m-vllm", json={"enabled": True}).status_code == 200
    assert sorted(served(gw)) == ["m-sim", "m-vllm"]


def test_a_replicas_engine_is_swapped_after_the_new_one_is_warm(
    gw: Gateway, admin: tuple[httpx.Client, httpx.Client, str], vllm: VLLMStandIn
) -> None:
    api, page, csrf = admin
    before = len(vllm.requests)
    form = {
        "csrf_token": csrf,
        "alias": "m",
        "name": "m-sim",
        "kind": "vllm",
        "config.base_url": vllm.base_url,
        "config.model": "m",
    }
    r = page.post("/models/replicas/swap", data={**form, "config.base_url": f"http://127.0.0.1:{free_port()}"})
    assert r.status_code == 400 and "is not healthy" in r.text and served(gw)["m-sim"].spec.engine_kind == "sim"
    r = page.post("/models/replicas/swap", data=form)
    assert r.status_code == 200 and "Swapped m-sim to vllm" in r.text
    assert served(gw)["m-sim"].spec.engine_kind == "vllm" and "m-sim" in gw.gateway.registry.warm
    assert ask(gw) == 200 and len(vllm.requests) > before  # both replicas are the stand-in now
    r = api.delete("/models/m/replicas/m-vllm")
    assert r.status_code == 200 and r.json()["deployments"] == ["m-sim"]
    assert api.delete("/models/m/replicas/m-sim").status_code == 409  # never the last


def test_a_drain_reaches_another_gateway_replica_in_place(pg_database: str, tmp_path: Path) -> None:
    def replica(name: str) -> ServerThread:
        settings = in_process_settings(
            data_dir=tmp_path / name, database_url=pg_database, admin_password=PASSWORD, policy_poll_interval_s=3600
        )
        return ServerThread(create_app(settings)).start(wait_ready=True)

    asyncio.run(seed(pg_database, models={"m": sim_model("m") + sim_model("n")}))  # replicas m-sim, n-sim
    a, b = replica("a"), replica("b")
    try:
        for r in (a, b):
            wait_for(lambda r=r: r.runtime.config_changes.connected, within=30, what="the replica's LISTEN")  # type: ignore[misc]
        api, _, _ = logged_in(a.base_url)
        live = {d.spec.name: d for d in b.runtime.registry.replicas("m")}
        assert api.patch("/models/m/replicas/m-sim", json={"draining": True}).status_code == 200
        wait_for(lambda: live["m-sim"].draining, within=10, what="b drains m-sim")
        assert {d.spec.name: d for d in b.runtime.registry.replicas("m")} == live  # the same engines: no restart
    finally:
        a.stop()
        b.stop()
