"""Prices and cost through the real server with the official SDK: an alias's price set by the
admin API, each usage row's cost computed once at the price in force when the request was
admitted (a change mid-stream applies to the next request only), exact integer arithmetic;
the usage page and CSV show the spend per key and model; bad prices refused naming the field."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support import Gateway, row_of, sim_model, start_gateway

PASSWORD = "prices password"
MSGS: Any = [{"role": "user", "content": "What does it cost?"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # Decode slow enough that a stream is still running when the price changes.
    models = {"sim": sim_model("sim", decode_ms_base=20), "free": sim_model("free")}
    gateway = start_gateway(
        tmp_path_factory.mktemp("prices"),
        admin_password=PASSWORD,
        usage_flush_interval_s=0.05,
        seed_with={"models": models, "tenants": {"acme": {}}},
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin(gw: Gateway) -> Iterator[httpx.Client]:
    client = httpx.Client(base_url=gw.base_url, timeout=30)
    login = client.post("/admin/api/login", json={"username": "admin", "password": PASSWORD})
    client.headers["X-CSRF-Token"] = login.json()["csrf_token"]
    yield client
    client.close()


@pytest.fixture
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)


def expected(prompt: int, completion: int, input_micros: int, output_micros: int) -> int:
    """Micro-units, rounded half up from the exact figure (per 1M tokens)."""
    return (prompt * input_micros + completion * output_micros + 500_000) // 1_000_000


def test_each_row_costs_the_price_it_was_admitted_at(gw: Gateway, admin: httpx.Client, client: openai.OpenAI) -> None:
    put = admin.put("/admin/api/models/sim/price", json={"input": "0.15", "output": 0.6})
    assert put.status_code == 200, put.text
    assert put.json() == {
        "alias": "sim",
        "currency": "USD",
        "per": "1M tokens",
        "priced": True,
        "input": "0.15",
        "output": "0.6",
        "cached_input": None,
    }

    r = client.chat.completions.create(model="sim", messages=MSGS, max_tokens=7)
    row = row_of(gw, r.id)
    assert (row.prompt_tokens, row.completion_tokens) == (r.usage.prompt_tokens, r.usage.completion_tokens)
    assert row.cost_micros == expected(row.prompt_tokens, row.completion_tokens, 150_000, 600_000)
    assert row.cost_micros > 0

    # A stream admitted at the old price keeps it; the request after the change pays the new one.
    stream = client.chat.completions.create(
        model="sim", messages=MSGS, max_tokens=30, stream=True, stream_options={"include_usage": True}
    )
    chunks = iter(stream)
    first = next(chunks)
    assert admin.put("/admin/api/models/sim/price", json={"input": "3", "output": "12.5"}).status_code == 200
    rest = list(chunks)
    assert rest[-2].choices[0].finish_reason == "length"  # still running when the price changed
    old = row_of(gw, first.id)
    assert old.cost_micros == expected(old.prompt_tokens, old.completion_tokens, 150_000, 600_000)

    after = client.chat.completions.create(model="sim", messages=MSGS, max_tokens=7)
    new = row_of(gw, after.id)
    assert new.cost_micros == expected(new.prompt_tokens, new.completion_tokens, 3_000_000, 12_500_000)

    # A model without a price: no cost (not zero, which would be a price of 0).
    free = client.chat.completions.create(model="free", messages=MSGS, max_tokens=3)
    assert row_of(gw, free.id).cost_micros is None

    audit = admin.get("/admin/api/audit", params={"limit": 5}).json()
    changes = [a for a in audit if a["entity"] == "model" and a["entity_id"] == "sim"]
    assert changes[0]["before"]["price"]["input"] == "0.15" and changes[0]["after"]["price"]["output"] == "12.5"


def test_the_usage_page_and_csv_show_the_spend(gw: Gateway, admin: httpx.Client, client: openai.OpenAI) -> None:
    admin.put("/admin/api/models/sim/price", json={"input": "1", "output": "2"})
    client.chat.completions.create(model="sim", messages=MSGS, max_tokens=5)
    rows = gw.usage_rows("acme")
    tenant_id = rows[0].tenant_id
    total = sum(r.cost_micros or 0 for r in rows)
    sim_total = sum(r.cost_micros or 0 for r in rows if r.model == "sim")
    page = admin.get(f"/admin/tenants/{tenant_id}/usage?period=hour").text
    assert f'data-figure="spend">{total / 1_000_000:.6f}'.rstrip("0").rstrip(".") + " USD<" in page
    assert f"<td>sim</td><td>{sum(r.model == 'sim' for r in rows)}</td>" in page
    assert f'data-spend="{sim_total}"' in page and 'data-spend="0"' in page  # "free" spent nothing
    exported = list(csv.DictReader(io.StringIO(admin.get(f"/admin/tenants/{tenant_id}/usage.csv?period=hour").text)))
    assert sorted(int(x["cost_micros"] or 0) for x in exported) == sorted(r.cost_micros or 0 for r in rows)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "-1", "output": "1"}, "input"),
        ({"input": "1", "output": "0.0000001"}, "output"),
        ({"input": "1"}, "output"),
        ({"input": "x", "output": "1"}, "input"),
        ({"cached_input": "1"}, "input"),
    ],
)
def test_a_bad_price_is_refused_naming_the_field(admin: httpx.Client, body: dict[str, Any], param: str) -> None:
    r = admin.put("/admin/api/models/sim/price", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert admin.put("/admin/api/models/nope/price", json={"input": 1, "output": 1}).status_code == 404


def test_removing_the_price(gw: Gateway, admin: httpx.Client, client: openai.OpenAI) -> None:
    gone = admin.put("/admin/api/models/sim/price", json={"input": None, "output": None}).json()
    assert gone["priced"] is False and admin.get("/admin/api/models/sim/price").json() == gone
    r = client.chat.completions.create(model="sim", messages=MSGS, max_tokens=3)
    assert row_of(gw, r.id).cost_micros is None


def test_the_models_page_sets_and_shows_prices(gw: Gateway, admin: httpx.Client) -> None:
    csrf = admin.headers["X-CSRF-Token"]
    form = {"csrf_token": csrf, "alias": "free", "price_input": "0.5", "price_output": "1.25", "price_cached_input": ""}
    saved = admin.post("/admin/models/price", data=form)
    assert saved.status_code == 200 and "free costs 0.5 in, 1.25 out per 1M tokens (USD)." in saved.text
    assert "<tr><td>free</td><td>0.5</td><td>1.25</td><td>0.5</td></tr>" in saved.text
    assert admin.get("/admin/api/models/free/price").json()["output"] == "1.25"
    refused = admin.post("/admin/models/price", data={**form, "price_output": "lots"})
    assert refused.status_code == 400 and 'value="lots"' in refused.text  # what was typed is kept
    cleared = admin.post("/admin/models/price", data={**form, "price_input": "", "price_output": ""})
    assert "free has no price." in cleared.text and admin.get("/admin/api/models/free/price").json()["priced"] is False
