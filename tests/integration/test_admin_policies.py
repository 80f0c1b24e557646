"""Lanes and task policies added, reordered and deleted through the admin service (the JSON
API and the page's forms alike): the API's checks and words, an audit row each, and the
running gateway's policy snapshot changed at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support import Gateway, sim_model, start_gateway

PASSWORD = "correct horse battery"
LANES = [
    {"name": "interactive", "match_stream": True, "max_concurrency": 4},
    {"name": "batch", "match_tasks": ["batch"]},
    {"name": "standard"},
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = {"chat": sim_model("chat"), "bulk": sim_model("bulk", lanes=["batch"])}  # bulk-sim: batch only
    seed = {"models": models, "lanes": LANES, "tasks": [{"task": "chat", "max_tokens": 300, "stop": ["###"]}]}
    gateway = start_gateway(tmp_path_factory.mktemp("policies"), seed_with=seed, admin_password=PASSWORD)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw: Gateway) -> Iterator[httpx.Client]:
    client = httpx.Client(base_url=gw.base_url + "/admin/api")
    client.headers["X-CSRF-Token"] = client.post("/login", json={"username": "admin", "password": PASSWORD}).json()[
        "csrf_token"
    ]
    yield client
    client.close()


@pytest.fixture(scope="module")
def page(gw: Gateway, admin: httpx.Client) -> Iterator[tuple[httpx.Client, str]]:
    client = httpx.Client(base_url=gw.base_url + "/admin", cookies=admin.cookies)
    yield client, admin.headers["X-CSRF-Token"]
    client.close()


def lanes_now(gw: Gateway) -> list[str]:
    return [lane.name for lane in gw.server.runtime.policies.current.lanes]


def audit(admin: httpx.Client, n: int = 1) -> list[dict[str, Any]]:
    return list(admin.get("/audit", params={"limit": n}).json())


def test_the_lanes_are_reordered_at_once_and_only_with_every_lane_named(gw: Gateway, admin: httpx.Client) -> None:
    r = admin.put("/lanes", json={"order": ["standard", "interactive"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "order"
    assert "interactive, batch, standard" in r.json()["error"]["message"]
    assert admin.put("/lanes", json={"order": ["batch", "batch", "standard"]}).status_code == 400
    assert lanes_now(gw) == ["interactive", "batch", "standard"]  # nothing changed
    r = admin.put("/lanes", json={"order": ["batch", "interactive", "standard"]})
    assert r.status_code == 200 and r.json() == {"order": ["batch", "interactive", "standard"]}
    assert lanes_now(gw) == ["batch", "interactive", "standard"]
    [entry] = audit(admin)
    assert (entry["action"], entry["entity"]) == ("reorder", "lanes")
    assert entry["before"] == {"order": ["interactive", "batch", "standard"]} and entry["after"] == r.json()
    assert admin.put("/lanes", json={"order": ["interactive", "batch", "standard"]}).status_code == 200


def test_a_lane_a_deployment_is_dedicated_to_cannot_be_deleted(gw: Gateway, admin: httpx.Client) -> None:
    r = admin.delete("/lanes/batch")
    error = r.json()["error"]
    assert r.status_code == 409 and error["code"] == "conflict"
    assert "'bulk-sim' (bulk) is dedicated to it" in error["message"]
    assert "batch" in lanes_now(gw)
    assert admin.delete("/lanes/nope").status_code == 404


def test_the_page_adds_moves_and_deletes_a_lane(
    gw: Gateway, admin: httpx.Client, page: tuple[httpx.Client, str]
) -> None:
    browser, csrf = page
    r = browser.post(
        "/lanes",
        data={
            "csrf_token": csrf,
            "name": "short",
            "match_max_prompt_tokens": "100",
            "max_concurrency": "",
            "queue_timeout_s": "0",
        },
    )
    assert r.status_code == 400 and "queue_timeout_s must be a number, greater than 0." in r.text
    assert 'id="error-new-lane-queue_timeout_s"' in r.text and 'value="100"' in r.text  # beside it; typed kept
    r = browser.post(
        "/lanes",
        data={
            "csrf_token": csrf,
            "name": "short",
            "match_max_prompt_tokens": "100",
            "max_concurrency": "",
            "queue_timeout_s": "",
        },
    )
    assert r.status_code == 200 and "Added the lane short" in r.text
    assert lanes_now(gw)[-1] == "short"  # last, with the defaults for what was left blank
    assert gw.server.runtime.policies.current.lane("short").max_concurrency is None  # no cap: the learned limit
    assert browser.post("/lanes", data={"csrf_token": csrf, "name": "short"}).status_code == 409
    assert browser.post("/lanes/short/move", data={"csrf_token": csrf, "direction": "up"}).status_code == 200
    assert lanes_now(gw) == ["interactive", "batch", "short", "standard"]
    r = browser.post("/lanes/batch/delete", data={"csrf_token": csrf})
    assert r.status_code == 409 and "is dedicated to it" in r.text
    r = browser.post("/lanes/short/delete", data={"csrf_token": csrf})
    assert r.status_code == 200 and "Deleted the lane short" in r.text
    assert lanes_now(gw) == ["interactive", "batch", "standard"]
    [deleted] = audit(admin)
    assert (deleted["action"], deleted["entity_id"], deleted["after"]) == ("delete", "short", None)
    assert deleted["before"]["match_max_prompt_tokens"] == 100


def test_stops_are_edited_as_a_list_and_a_task_policy_is_added_and_deleted(
    gw: Gateway, admin: httpx.Client, page: tuple[httpx.Client, str]
) -> None:
    browser, csrf = page
    form = {
        "csrf_token": csrf,
        "max_tokens": "200",
        "long_prompt_tokens": "",
        "long_prompt_max_tokens": "",
        "stop": ["###", "a, b", ""],
    }  # one box per stop
    r = browser.post("/tasks/chat", data=form)
    assert r.status_code == 200 and "Saved chat" in r.text
    assert gw.server.runtime.policies.current.tasks["chat"].stop == ("###", "a, b")  # a comma is a stop's own
    r = browser.post("/tasks", data={"csrf_token": csrf, "task": "extract", "max_tokens": "64", "stop": "END"})
    assert r.status_code == 200 and gw.server.runtime.policies.current.tasks["extract"].max_tokens == 64
    r = browser.post("/tasks", data={"csrf_token": csrf, "task": "extract", "max_tokens": "64"})
    assert r.status_code == 409 and "There is already a task named &#39;extract&#39;." in r.text
    assert admin.delete("/tasks/extract").status_code == 200
    assert "extract" not in gw.server.runtime.policies.current.tasks
    assert admin.delete("/tasks/extract").status_code == 404
    assert audit(admin)[0]["action"] == "delete"


def test_the_page_ticks_and_unticks_a_lanes_background_box(
    gw: Gateway, admin: httpx.Client, page: tuple[httpx.Client, str]
) -> None:
    browser, csrf = page
    shown = browser.get("/policies").text
    assert 'name="background" value="true"' in shown and "Background (batch work)" in shown
    r = browser.post("/lanes/batch", data={"csrf_token": csrf, "max_concurrency": "64", "background": "true"})
    assert r.status_code == 200 and gw.server.runtime.policies.current.lane("batch").background
    assert "only slots the foreground lanes leave" in r.text
    [entry] = audit(admin)
    assert (entry["before"]["background"], entry["after"]["background"]) == (False, True)
    r = browser.post("/lanes/batch", data={"csrf_token": csrf, "max_concurrency": "64"})  # the box unticked
    assert r.status_code == 200 and not gw.server.runtime.policies.current.lane("batch").background
    r = admin.put("/lanes/batch", json={"background": None})  # it always has a value
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"
