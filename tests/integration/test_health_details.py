"""/health/ready tells the right people: anonymous probes (load balancers, Kubernetes) get
the status and Retry-After only; the metrics token or an admin session also get the names
and reasons (aliases, deployments, warm, failed, ejected); the admin dashboard shows them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import Gateway, sim_model, start_gateway, wait_for

PASSWORD = "correct horse battery"
TOKEN = "metrics-secret-token"
BROKEN = [{"name": "broken-llama", "engine_kind": "llamacpp", "config": {"model_path": "/nonexistent/model.gguf"}}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # Health checks an hour apart: none brings the ejected deployment back mid-test.
    gateway = start_gateway(
        tmp_path_factory.mktemp("health"),
        seed_with={"models": {"chat": sim_model("chat")}},
        admin_password=PASSWORD,
        metrics_token=TOKEN,
        policy_poll_interval_s=3600,
    )
    yield gateway
    gateway.stop()


def admin_cookie(base_url: str) -> str:
    r = httpx.post(base_url + "/admin/api/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200, r.text
    return str(r.cookies["laneway_admin"])


def ready(gw: Gateway, **headers: str) -> httpx.Response:
    return httpx.get(gw.base_url + "/health/ready", headers=headers)


def test_anonymous_probes_get_the_status_only(gw: Gateway) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": TOKEN},
        {"Cookie": "laneway_admin=not-a-session"},
    ):
        r = ready(gw, **headers)
        assert r.status_code == 200 and r.json() == {"status": "ready"}, (headers, r.text)
        assert "chat" not in r.text


def test_the_metrics_token_and_an_admin_session_get_the_details(gw: Gateway) -> None:
    for headers in ({"Authorization": f"Bearer {TOKEN}"}, {"Cookie": f"laneway_admin={admin_cookie(gw.base_url)}"}):
        body = ready(gw, **headers).json()
        assert body["status"] == "ready" and body["models"] == ["chat"], body
        assert body["deployments"] == [
            {"name": "chat-sim", "alias": "chat", "engine": "sim", "warm": True, "healthy": True}
        ]
        assert (body["warm"], body["failed"], body["ejected"], body["rejected_changes"]) == (["chat-sim"], {}, {}, {})


def test_an_ejected_deployment_is_named_with_its_reason(gw: Gateway) -> None:
    registry = gw.gateway.registry
    (deployment,) = registry.deployments()
    for _ in range(3):  # three engine errors in a row eject it
        gw.server.call(_record_failure(registry, deployment))
    try:
        body = ready(gw, Authorization=f"Bearer {TOKEN}").json()
        assert body["ejected"] == {
            "chat-sim": "ejected after 3 consecutive engine errors; back when a health check passes"
        }, body
        assert body["deployments"][0]["healthy"] is False
        assert "chat-sim" not in ready(gw).text
        dashboard = httpx.get(
            gw.base_url + "/admin/dashboard/panel", cookies={"laneway_admin": admin_cookie(gw.base_url)}
        )
        assert dashboard.status_code == 200 and "ejected after 3 consecutive engine errors" in dashboard.text
    finally:
        gw.server.call(_record_success(registry, deployment))


async def _record_failure(registry, deployment) -> None:  # type: ignore[no-untyped-def]
    registry.record(deployment, ok=False)


async def _record_success(registry, deployment) -> None:  # type: ignore[no-untyped-def]
    registry.record(deployment, ok=True)
    deployment.healthy = True


def test_the_dashboard_shows_readiness_and_the_deployments(gw: Gateway) -> None:
    page = httpx.get(gw.base_url + "/admin/dashboard", cookies={"laneway_admin": admin_cookie(gw.base_url)})
    assert page.status_code == 200 and "Readiness: ready" in page.text
    assert "<td>chat</td><td>chat-sim</td><td>sim</td>" in page.text


def test_an_unready_replica_tells_a_probe_503_and_when_to_retry_only(tmp_path: Path) -> None:
    """No metrics token set here: nobody holds it, so only an admin session sees the reasons."""
    gw = start_gateway(
        tmp_path,
        seed_with={"models": {"chat": sim_model("chat"), "llama": BROKEN}},
        admin_password=PASSWORD,
        wait_ready=False,
    )
    try:
        wait_for(
            lambda: gw.server.runtime.running and "broken-llama" in gw.gateway.registry.failed,
            what="the broken deployment failed",
        )
        for headers in ({}, {"Authorization": "Bearer anything"}):
            r = ready(gw, **headers)
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            assert r.json() == {"status": "not_ready"} and "llama" not in r.text
        body = ready(gw, Cookie=f"laneway_admin={admin_cookie(gw.base_url)}").json()
        assert body["status"] == "not_ready" and "broken-llama" in body["failed"], body
        assert body["failed"]["broken-llama"]
        page = httpx.get(gw.base_url + "/admin/dashboard", cookies={"laneway_admin": admin_cookie(gw.base_url)})
        assert "Readiness: not ready" in page.text and "broken-llama" in page.text
    finally:
        gw.stop()
