"""Security headers on every /admin response (pages, JSON API, static files, errors), and
/metrics and /schema behind the metrics token when one is set."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from laneway.admin.ui import ADMIN_UI_DIR
from support import Gateway, sim_model, start_gateway

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'"
)
TOKEN = "metrics-s3cret"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(
        tmp_path_factory.mktemp("headers"),
        seed_with={"models": {"sim": sim_model("sim")}},
        admin_password="correct horse battery",
        metrics_token=TOKEN,
    )
    yield gw
    gw.stop()


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/admin/login", 200),
        ("GET", "/admin/", 303),
        ("GET", "/admin/tenants", 303),
        ("GET", "/admin/api/tenants", 401),
        ("POST", "/admin/api/login", 400),
        ("GET", "/admin/static/htmx.min.js", 200),
        ("GET", "/admin/static/admin.css", 200),
        ("GET", "/admin/no-such-page", 404),
        ("GET", "/admin/static/nope.js", 404),
    ],
)
def test_every_admin_response_carries_the_security_headers(gw: Gateway, method: str, path: str, status: int) -> None:
    r = httpx.request(method, gw.base_url + path, content=b"{" if method == "POST" else None)
    assert r.status_code == status
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "same-origin"


def test_the_serving_api_is_left_alone(gw: Gateway) -> None:
    r = httpx.get(gw.base_url + "/health/live")
    assert r.status_code == 200 and "content-security-policy" not in r.headers


def test_templates_need_no_inline_script_or_style() -> None:
    """What the CSP forbids: inline <script>, <style> blocks, style= and on*= attributes."""
    for page in sorted((ADMIN_UI_DIR / "templates").glob("*.html")):
        html = page.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), page.name
        assert "<style" not in html, page.name
        assert not re.search(r"\sstyle\s*=", html), page.name
        assert not re.search(r"\son[a-z]+\s*=", html), page.name
    base = (ADMIN_UI_DIR / "templates" / "base.html").read_text()
    assert '"includeIndicatorStyles": false' in base  # htmx would inject a <style> otherwise


@pytest.mark.parametrize("path", ["/metrics", "/schema/openapi.json", "/schema"])
def test_metrics_and_schema_need_the_token_when_set(gw: Gateway, path: str) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
    ):
        r = httpx.get(gw.base_url + path, headers=headers)
        assert r.status_code == 401, headers
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_metrics_token"
    r = httpx.get(gw.base_url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    if path == "/metrics":
        assert "laneway_event_loop_lag_seconds" in r.text


def test_metrics_and_schema_are_open_without_a_token(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path, seed_with={"models": {"sim": sim_model("sim")}})
    try:
        for path in ("/metrics", "/schema/openapi.json"):
            assert httpx.get(gw.base_url + path).status_code == 200, path
    finally:
        gw.stop()
