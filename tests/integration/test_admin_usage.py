"""The usage page and its CSV export against rows that real requests wrote (the openai SDK over
loopback), on SQLite and PostgreSQL; the dashboard answers from the metrics, without touching
the usage table; rejected tenant forms keep what was typed."""

from __future__ import annotations

import asyncio
import csv
import io
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from laneway.db.repositories import UsageRepository
from laneway.db.session import make_engine, make_sessionmaker
from sqlalchemy import event
from support import Gateway, sim_model, start_gateway

PASSWORD = "usage page password"
WEIRD_USER = 'ann, "the analyst"'  # a comma and quotes: the CSV must quote them


@pytest.fixture(params=["sqlite", "postgres"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gateway]:
    url = request.getfixturevalue("pg_database") if request.param == "postgres" else None
    gw = start_gateway(
        tmp_path,
        database_url=url,
        admin_password=PASSWORD,
        seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {"rpm": 4}, "other": {}}},
    )
    try:
        yield gw
    finally:
        gw.stop()


def _admin(gw: Gateway) -> httpx.Client:
    client = httpx.Client(base_url=gw.base_url, timeout=30)
    assert client.post("/admin/api/login", json={"username": "admin", "password": PASSWORD}).status_code == 200
    return client


def _traffic(gw: Gateway) -> None:
    acme = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    for i in range(6):  # rpm 4: two of them get 429
        try:
            acme.chat.completions.create(
                model="sim",
                messages=[{"role": "user", "content": f"hi {i}"}],
                max_tokens=3 + i,
                user=WEIRD_USER if i == 0 else "=HYPERLINK(1)",
            )
        except openai.RateLimitError:
            pass
    openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["other"], max_retries=0).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "not acme's"}], max_tokens=2
    )


def _figures(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-figure="(\w+)">([^<]*)<', html))


def _percentile_cont(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    return ordered[lo] if lo + 1 >= len(ordered) else ordered[lo] + (pos - lo) * (ordered[lo + 1] - ordered[lo])


def test_usage_page_and_csv_match_the_rows(gateway: Gateway) -> None:
    _traffic(gateway)
    rows = gateway.usage_rows("acme")
    assert len(rows) == 6 and sum(r.status == 429 for r in rows) == 2
    admin = _admin(gateway)
    tenant_id = rows[0].tenant_id

    page = admin.get(f"/admin/tenants/{tenant_id}/usage?period=hour")
    assert page.status_code == 200
    shown = _figures(page.text)
    assert shown["requests"] == "6" and shown["errors"] == "2"
    assert shown["prompt_tokens"] == f"{sum(r.prompt_tokens for r in rows):,}"
    assert shown["completion_tokens"] == f"{sum(r.completion_tokens for r in rows):,}"
    ttfts = [r.ttft_ms for r in rows if r.ttft_ms is not None]
    exact = _percentile_cont(ttfts, 0.95)  # from the rollups' histogram: within one bucket (x1.35)
    assert exact / 1.36 <= float(shown["ttft_p95"].removesuffix(" ms")) <= exact * 1.36
    assert '<svg id="requests-chart"' in page.text and '<svg id="ttft-chart"' in page.text
    assert re.search(r"<td>429</td><td><code>rate_limit_exceeded</code></td><td>2</td>", page.text)
    assert f'href="/admin/tenants/{tenant_id}/usage.csv?period=hour"' in page.text
    # The htmx fragment is the same panel, for the same period.
    panel = admin.get(f"/admin/tenants/{tenant_id}/usage/panel?period=hour")
    assert panel.text.lstrip().startswith('<div id="usage-panel"') and _figures(panel.text) == shown

    with admin.stream("GET", f"/admin/tenants/{tenant_id}/usage.csv?period=hour") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
        assert re.fullmatch(
            r'attachment; filename="usage-acme-hour-\d{8}T\d{6}Z\.csv"', response.headers["content-disposition"]
        )
        assert "content-length" not in response.headers  # streamed, not built first
        body = response.read().decode()
    parsed = list(csv.DictReader(io.StringIO(body)))
    assert [p["request_id"] for p in parsed] == [r.request_id for r in sorted(rows, key=lambda r: (r.created_at, r.id))]
    by_id = {r.request_id: r for r in rows}
    for p in parsed:
        r = by_id[p["request_id"]]
        assert (int(p["status"]), int(p["prompt_tokens"]), int(p["completion_tokens"])) == (
            r.status,
            r.prompt_tokens,
            r.completion_tokens,
        )
        assert p["error_code"] == (r.error_code or "")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", p["created_at"])
    assert parsed[0]["end_user"] == WEIRD_USER  # quoted on the way out, intact on the way back
    assert {p["end_user"] for p in parsed[1:]} == {"'=HYPERLINK(1)"}  # no formula for a spreadsheet to run


def test_periods_bound_the_rows_and_bad_input_is_refused(gateway: Gateway) -> None:
    _traffic(gateway)
    tenant_id = gateway.usage_rows("acme")[0].tenant_id
    old = {
        "request_id": "from-yesterday",
        "created_at": datetime.now(UTC) - timedelta(hours=3),
        "tenant_id": tenant_id,
        "model": "sim",
        "endpoint": "chat",
        "status": 200,
        "prompt_tokens": 1000,
        "completion_tokens": 1,
        "ttft_ms": 5.0,
    }

    async def write_old_row() -> None:
        engine = make_engine(gateway.database_url)
        async with make_sessionmaker(engine)() as s, s.begin():
            await UsageRepository(s).add_many([old])
        await engine.dispose()

    asyncio.run(write_old_row())
    admin = _admin(gateway)
    assert _figures(admin.get(f"/admin/tenants/{tenant_id}/usage?period=hour").text)["requests"] == "6"
    day = _figures(admin.get(f"/admin/tenants/{tenant_id}/usage?period=day").text)
    assert day["requests"] == "7" and _figures(admin.get(f"/admin/tenants/{tenant_id}/usage?period=30d").text) == day
    hour_csv = admin.get(f"/admin/tenants/{tenant_id}/usage.csv?period=hour").text
    day_csv = admin.get(f"/admin/tenants/{tenant_id}/usage.csv?period=day").text
    assert "from-yesterday" not in hour_csv and "from-yesterday" in day_csv.splitlines()[1]

    bad = admin.get(f"/admin/tenants/{tenant_id}/usage?period=week")
    assert bad.status_code == 400 and "period must be one of hour, day, 30d, 12m." in bad.text
    bad_csv = admin.get(f"/admin/tenants/{tenant_id}/usage.csv?period=week")
    assert bad_csv.status_code == 400 and bad_csv.json()["error"]["param"] == "period"
    assert admin.get("/admin/tenants/999/usage.csv").status_code == 404
    anonymous = httpx.get(f"{gateway.base_url}/admin/tenants/{tenant_id}/usage.csv", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/admin/login"


def test_the_dashboard_reads_metrics_not_the_usage_table(gateway: Gateway) -> None:
    _traffic(gateway)
    gateway.usage_rows()  # the rows are written: a table scan would find them
    engine = gateway.server.runtime.sessions.kw["bind"].sync_engine
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        admin = _admin(gateway)
        panel = admin.get("/admin/dashboard/panel").text
        page = admin.get("/admin/dashboard").text
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert statements and not [s for s in statements if "usage_records" in s]
    traffic = re.search(r'<table id="traffic">.*?</table>', panel, re.S)
    assert traffic is not None
    # 7 requests ran on the default lane (5 answered, 2 refused with 429), 2 of them errors.
    assert re.search(r"<td>default</td><td>7</td><td>[\d.]+</td>\s*<td>2</td>", traffic.group(0)), traffic.group(0)
    assert '<svg id="ttft-chart"' in page and 'name="viewport"' in page


def test_a_rejected_tenant_form_keeps_what_was_typed(gateway: Gateway) -> None:
    admin = _admin(gateway)
    page = admin.get("/admin/tenants/1").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    sent = {
        "csrf_token": csrf,
        "weight": "2.5",
        "rpm": "0",
        "tpm": "5000",
        "max_concurrency": "",
        "allowed_models": "sim, other",
        "allowed_lanes": "",
        "priority_floor": "0",
    }
    answer = admin.post("/admin/tenants/1", data=sent)
    assert answer.status_code == 400
    field = re.search(r'<div class="field invalid" id="field-rpm">.*?</div>', answer.text, re.S)
    assert field is not None, answer.text
    assert 'value="0"' in field.group(0) and 'aria-invalid="true"' in field.group(0)
    assert "Requests per minute must be a whole number from 1 to 2,147,483,647, or blank for unlimited." in field.group(
        0
    )
    assert "Expected" not in answer.text and "$." not in answer.text  # no raw msgspec text
    assert re.search(r'name="weight"[^>]*value="2.5"', answer.text) and re.search(
        r'name="tpm"[^>]*value="5000"', answer.text
    )
    assert 'value="sim,other"' in answer.text
    assert 'id="edit-error"' not in answer.text  # said next to the field, not twice
    # Nothing was saved.
    assert re.search(r'name="rpm"[^>]*value="4"', admin.get("/admin/tenants/1").text)

    created = admin.post(
        "/admin/tenants",
        data={"csrf_token": csrf, "name": "acme", "weight": "3", "rpm": "17", "tpm": "", "max_concurrency": "2"},
    )
    assert created.status_code >= 400  # acme exists
    assert re.search(r'name="name"[^>]*value="acme"', created.text) and re.search(
        r'name="rpm"[^>]*value="17"', created.text
    )
    assert re.search(r'id="create-error"[^>]*>[^<]*acme', created.text), created.text
