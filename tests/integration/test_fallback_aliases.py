"""Fallback aliases: set through the one admin service from the JSON API, the models page and
the CLI, audited; unknown aliases, repeats and loops refused at save with the field named;
the policy snapshot's fallbacks(alias) follows at once here and by NOTIFY on another replica."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from laneway.app import create_app
from support import EXE, Gateway, ServerThread, in_process_settings, sim_model, start_gateway, wait_for

PASSWORD = "correct horse battery"
MODELS = {alias: sim_model(alias) for alias in ("large", "small", "tiny")}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("fallbacks"), seed_with={"models": MODELS}, admin_password=PASSWORD)
    yield gateway
    gateway.stop()


def login(base_url: str) -> httpx.Client:
    client = httpx.Client(base_url=base_url + "/admin/api")
    r = client.post("/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200, r.text
    client.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    return client


@pytest.fixture
def admin(gw: Gateway) -> Iterator[httpx.Client]:
    client = login(gw.base_url)
    yield client
    for alias in MODELS:  # each test starts with no fallbacks
        assert client.put(f"/models/{alias}/fallbacks", json={"fallbacks": []}).status_code == 200
    client.close()


def snapshot(gw: Gateway) -> Any:
    return gw.server.runtime.policies.current


def refused(r: httpx.Response, param: str, said: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request", error
    assert error["param"] == param and said in error["message"], error


def test_fallbacks_set_through_the_api_apply_at_once_and_are_audited(gw: Gateway, admin: httpx.Client) -> None:
    assert admin.get("/models/large/fallbacks").json() == {"alias": "large", "fallbacks": []}
    r = admin.put("/models/large/fallbacks", json={"fallbacks": ["small", "tiny"]})
    assert r.status_code == 200 and r.json() == {"alias": "large", "fallbacks": ["small", "tiny"]}, r.text
    assert snapshot(gw).fallbacks("large") == ("small", "tiny")  # this replica: no poll awaited
    assert snapshot(gw).fallbacks("small") == ()
    assert admin.get("/models/large/fallbacks").json()["fallbacks"] == ["small", "tiny"]
    entry = admin.get("/audit", params={"limit": 1}).json()[0]
    assert (entry["actor"], entry["action"], entry["entity"], entry["entity_id"]) == (
        "admin",
        "update",
        "model",
        "large",
    )
    assert entry["before"] == {"fallbacks": []} and entry["after"] == {"fallbacks": ["small", "tiny"]}
    # The order is the admin's, and [] removes them.
    admin.put("/models/large/fallbacks", json={"fallbacks": ["tiny", "small"]})
    assert snapshot(gw).fallbacks("large") == ("tiny", "small")
    assert admin.put("/models/large/fallbacks", json={"fallbacks": []}).json()["fallbacks"] == []
    assert snapshot(gw).fallbacks("large") == ()
    # A change needs the CSRF token, as every admin change.
    r = admin.put("/models/large/fallbacks", json={"fallbacks": ["small"]}, headers={"X-CSRF-Token": "forged"})
    assert r.status_code == 403 and snapshot(gw).fallbacks("large") == ()


def test_loops_unknown_aliases_and_repeats_are_refused_at_save(gw: Gateway, admin: httpx.Client) -> None:
    assert admin.put("/models/large/fallbacks", json={"fallbacks": ["small"]}).status_code == 200
    refused(
        admin.put("/models/small/fallbacks", json={"fallbacks": ["large"]}),
        "fallbacks[0]",
        "would make a loop: small -> large -> small",
    )
    # Longer: large -> small -> tiny, then tiny -> large closes it.
    assert admin.put("/models/small/fallbacks", json={"fallbacks": ["tiny"]}).status_code == 200
    refused(
        admin.put("/models/tiny/fallbacks", json={"fallbacks": ["large"]}),
        "fallbacks[0]",
        "tiny -> large -> small -> tiny",
    )
    refused(admin.put("/models/tiny/fallbacks", json={"fallbacks": ["tiny"]}), "fallbacks[0]", "to itself")
    refused(
        admin.put("/models/large/fallbacks", json={"fallbacks": ["small", "nope"]}),
        "fallbacks[1]",
        "no model alias 'nope'",
    )
    refused(admin.put("/models/large/fallbacks", json={"fallbacks": ["small", "small"]}), "fallbacks[1]", "twice")
    refused(admin.put("/models/large/fallbacks", json={"fallbacks": "small"}), "fallbacks", "a list")
    refused(admin.put("/models/large/fallbacks", json={"fallbacks": ["bad\x00name"]}), "fallbacks[0]", "control")
    r = admin.put("/models/nope/fallbacks", json={"fallbacks": ["small"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    # Nothing refused was saved.
    assert (snapshot(gw).fallbacks("large"), snapshot(gw).fallbacks("small")) == (("small",), ("tiny",))
    assert snapshot(gw).fallbacks("tiny") == ()


def test_the_models_page_sets_fallbacks_from_a_comma_list(gw: Gateway, admin: httpx.Client) -> None:
    page = httpx.Client(base_url=gw.base_url, cookies=admin.cookies)
    csrf = admin.headers["X-CSRF-Token"]
    r = page.post("/admin/models/fallbacks", data={"csrf_token": csrf, "alias": "large", "fallbacks": " small, tiny "})
    assert r.status_code == 200 and "large falls back to small, tiny." in r.text, r.text
    assert re.search(r"<td>large</td><td>small, tiny</td>", r.text)
    assert snapshot(gw).fallbacks("large") == ("small", "tiny")
    # A loop is refused on the page, what was typed kept, nothing changed.
    r = page.post("/admin/models/fallbacks", data={"csrf_token": csrf, "alias": "tiny", "fallbacks": "large"})
    assert r.status_code == 400 and "would make a loop: tiny -&gt; large -&gt; tiny" in r.text, r.text
    assert 'value="large"' in r.text and snapshot(gw).fallbacks("tiny") == ()
    r = page.post("/admin/models/fallbacks", data={"csrf_token": csrf, "alias": "large", "fallbacks": ""})
    assert r.status_code == 200 and "large falls back to none." in r.text
    assert snapshot(gw).fallbacks("large") == ()
    assert page.post("/admin/models/fallbacks", data={"alias": "large", "fallbacks": "small"}).status_code == 403


def test_the_cli_sets_fallbacks_through_the_admin_service(tmp_path: Path) -> None:
    env = {**os.environ, "LANEWAY_DATA_DIR": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120)

    for alias in ("big", "small"):
        assert cli("model", "set", alias, "--engine", "sim").returncode == 0
    out = cli("model", "fallbacks", "big", "small")
    assert out.returncode == 0 and out.stdout.strip() == "model big falls back to small", out.stderr
    refusals = [
        (["small", "big"], "laneway: The fallbacks of 'small' would make a loop: small -> big -> small."),
        (["small", "small"], "laneway: The model 'small' cannot fall back to itself."),
        (["small", "big,gone"], "laneway: There is no model alias 'gone' to fall back to."),
    ]
    for args, said in refusals:
        out = cli("model", "fallbacks", *args)
        assert out.returncode == 1 and out.stderr.strip() == said, out.stderr
    with sqlite3.connect(tmp_path / "laneway.db") as db:
        rows = dict(db.execute("SELECT alias, fallbacks FROM models").fetchall())
        audit = db.execute("SELECT action, entity, entity_id, after FROM audit_log ORDER BY id DESC LIMIT 1").fetchone()
    assert rows == {"big": '["small"]', "small": "[]"}
    assert audit[:3] == ("update", "model", "big") and '"small"' in audit[3]
    assert cli("model", "fallbacks", "big", "none").stdout.strip() == "model big falls back to nothing"


def test_a_fallback_change_reaches_the_other_replica_by_notify(pg_database: str, tmp_path: Path) -> None:
    """The accessor the pipeline reads, on a replica that did not make the change (polling is
    an hour away: only NOTIFY can bring it)."""
    seeded = start_gateway(
        tmp_path / "a",
        database_url=pg_database,
        seed_with={"models": MODELS},
        admin_password=PASSWORD,
        policy_poll_interval_s=3600,
        wait_ready=False,
    )
    settings = in_process_settings(data_dir=tmp_path / "b", database_url=pg_database, policy_poll_interval_s=3600)
    b = ServerThread(create_app(settings)).start(wait_ready=False)
    try:
        for r in (seeded.server, b):
            wait_for(
                lambda r=r: r.runtime.running and r.runtime.config_changes.connected,  # type: ignore[misc]
                within=30,
                what="the replica's LISTEN",
            )
        admin = login(seeded.base_url)
        assert admin.put("/models/large/fallbacks", json={"fallbacks": ["small", "tiny"]}).status_code == 200
        wait_for(
            lambda: b.runtime.policies.current.fallbacks("large") == ("small", "tiny"),
            within=10,
            what="replica b's fallbacks of large",
        )
        assert admin.put("/models/large/fallbacks", json={"fallbacks": []}).status_code == 200
        wait_for(
            lambda: b.runtime.policies.current.fallbacks("large") == (), within=10, what="replica b's fallbacks cleared"
        )
    finally:
        seeded.stop()
        b.stop()
