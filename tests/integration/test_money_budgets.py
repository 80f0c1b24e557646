"""Money budgets through real servers: two gateway replicas on one PostgreSQL database and one
Redis refuse a tenant's daily budget exactly at its limit (429 budget_exceeded, Retry-After
and the reset time), a key's monthly budget as well; a request is reserved at its most cost
and refunded to what it cost; a budget's counter lost with Redis's data is seeded again from
the usage rows. The model's price is 1 micro-unit per token (in and out), so
a request's cost is its tokens. The limiters' wall clock is injected."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from laneway.core.quota import period
from prometheus_client.parser import text_string_to_metric_families
from support import (
    REDIS_URL,
    Gateway,
    KeySpec,
    PrivateRedis,
    Wall,
    replica_pair,
    require_service,
    sim_model,
    start_gateway,
    wait_for,
)

PASSWORD = "budget password"
TENANTS = {
    "daily": {"budget_per_day": 100},
    "refund": {"budget_per_day": 300},
    "keyed": {},
    "alerted": {"budget_per_day": 100},
}
KEYS = {name: KeySpec(name) for name in TENANTS}


class Hooks(BaseHTTPRequestHandler):
    """The budget alert webhook: keeps what it is sent."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        Hooks.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def webhook() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hooks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/budget"
    server.shutdown()


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, pg_database_module: str, webhook: str
) -> Iterator[list[Gateway]]:
    require_service("Redis", "127.0.0.1", 6379)
    shared: dict[str, Any] = {
        "database_url": pg_database_module,
        "redis_url": REDIS_URL,
        "redis_prefix": f"lwtest:{uuid.uuid4().hex}:",
        "admin_password": PASSWORD,
        "usage_flush_interval_s": 0.05,
        "budget_alert_webhook_url": webhook,
    }
    seed = {
        "models": {"sim": sim_model("sim", decode_ms_base=0.5, max_concurrency=64)},
        "tenants": TENANTS,
        "keys": KEYS,
    }
    with replica_pair(
        lambda: start_gateway(tmp_path_factory.mktemp("a"), seed_with=seed, **shared),
        lambda: start_gateway(tmp_path_factory.mktemp("b"), **shared),
    ) as pair:
        admin = admin_client(pair[0])
        assert admin.put("/models/sim/price", json={"input": "1", "output": "1"}).status_code == 200
        for gw in pair:  # b hears of the price by NOTIFY
            wait_for(lambda gw=gw: gw.gateway.policies.current.price("sim") is not None, what="the price")
        yield pair


@pytest.fixture
def wall(replicas: list[Gateway]) -> Iterator[Wall]:
    clock = Wall()
    for gw in replicas:
        gw.gateway.limiter.wall_clock = clock
    yield clock
    for gw in replicas:
        gw.gateway.limiter.wall_clock = time.time


def admin_client(gw: Gateway) -> httpx.Client:
    admin = httpx.Client(base_url=gw.base_url + "/admin/api", timeout=30)
    login = admin.post("/login", json={"username": "admin", "password": PASSWORD})
    admin.headers["X-CSRF-Token"] = login.json()["csrf_token"]
    return admin


def complete(gw: Gateway, key: str, max_tokens: int = 9, **kw: Any) -> Any:
    c = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys[key], max_retries=0)
    return c.completions.create(model="sim", prompt="hi", max_tokens=max_tokens, **kw)


def counter(gw: Gateway, tenant_id: int, name: str) -> int:
    limiter = gw.gateway.limiter
    assert gw.server.call(limiter.settled())
    value = gw.server.call(limiter._redis.get(limiter.keys.counter(tenant_id, name)))
    return int(value or 0)


def test_two_replicas_refuse_a_daily_budget_exactly_at_its_limit(replicas: list[Gateway], wall: Wall) -> None:
    wall.set("2026-03-30T23:59:00")
    spent, served = 0, 0
    for i in range(30):
        try:
            usage = complete(replicas[i % 2], "daily").usage
        except openai.RateLimitError as exc:
            error = exc.response.json()["error"]
            assert error["code"] == "budget_exceeded" and error["type"] == "rate_limit_error"
            assert "daily budget of 0.0001" in error["message"] and "2026-03-31T00:00:00Z" in error["message"]
            assert exc.response.headers["retry-after"] == "60"
            assert exc.response.headers["x-laneway-budget-reset"] == "2026-03-31T00:00:00Z"
            break
        spent, served, per_request = spent + usage.total_tokens, served + 1, usage.total_tokens
    else:
        pytest.fail("the budget never refused")
    # One counter for both replicas: refused when the next request's cost would pass 100.
    assert served == 100 // per_request and served >= 2 and spent + per_request > 100 >= spent
    with pytest.raises(openai.RateLimitError):
        complete(replicas[served % 2 - 1], "daily")  # the other replica refuses too
    replicas[1].server.call(replicas[1].server.runtime.recorder.flush())  # both replicas' rows written
    rows = replicas[0].usage_rows("daily")
    assert sum(r.cost_micros for r in rows if r.status == 200) == spent  # the rows hold what was counted
    assert [r.cost_micros for r in rows if r.status == 429] == [0, 0]  # a refusal cost nothing
    wall.set("2026-03-31T00:00:01")  # a new day: a new budget
    assert complete(replicas[1], "daily").usage.total_tokens == per_request


def test_reserved_at_the_most_cost_and_refunded_to_the_cost(replicas: list[Gateway], wall: Wall) -> None:
    wall.set("2026-04-02T10:00:00")
    a = replicas[0]
    word = complete(a, "refund", max_tokens=5).choices[0].text.split()[2]
    rows = a.usage_rows("refund")
    tenant_id = rows[0].tenant_id
    # Stopped early: it reserved prompt + 200 and cost far less.
    stopped = complete(a, "refund", max_tokens=200, stop=[" " + word])
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.total_tokens < 100
    costs = [r.cost_micros for r in a.usage_rows("refund")]
    assert counter(a, tenant_id, "cost:day:2026-04-02") == sum(costs) < 200
    # The room left is below one request's most cost, though its cost would fit: refused.
    left, prompt = 300 - sum(costs), rows[0].prompt_tokens
    with pytest.raises(openai.RateLimitError) as info:  # its most cost: left + 1
        complete(replicas[1], "refund", max_tokens=left - prompt + 1)
    assert info.value.response.json()["error"]["code"] == "budget_exceeded"
    assert counter(a, tenant_id, "cost:day:2026-04-02") == sum(costs)  # a refusal reserves nothing


def test_a_keys_monthly_budget(replicas: list[Gateway], wall: Wall) -> None:
    wall.set("2026-05-31T12:00:00")
    admin = admin_client(replicas[0])
    tenant_id = next(t["id"] for t in admin.get("/tenants", params={"q": "keyed"}).json()["data"])
    key_id = next(k["id"] for k in admin.get(f"/tenants/{tenant_id}/keys").json()["data"] if k["name"] == "keyed")
    r = admin.patch(f"/keys/{key_id}", json={"budget_per_month": 30})
    assert r.status_code == 200 and r.json()["budget_per_month"] == 30
    wait_for(lambda: refused(replicas[1], "keyed", 40) == "request_too_large", what="b applying the key's budget")
    served = 0
    while refused(replicas[served % 2], "keyed", 9) is None:
        served += 1
    assert refused(replicas[0], "keyed", 9) == "budget_exceeded" and 1 <= served <= 3
    wall.set("2026-06-01T00:00:00")
    assert refused(replicas[1], "keyed", 9) is None


def test_the_soft_threshold_alerts_once_per_period_across_replicas(replicas: list[Gateway], wall: Wall) -> None:
    def alerts() -> list[dict[str, Any]]:
        return [body for body in Hooks.received if body["tenant"] == "alerted"]

    wall.set("2026-06-10T09:00:00")
    served = 0
    while refused(replicas[served % 2], "alerted", 9) is None:  # to the budget's end, on both replicas
        served += 1
    wait_for(lambda: len(alerts()) == 1, what="the webhook")
    time.sleep(0.3)  # time passing is the point: a second one would have come by now
    [alert] = alerts()
    assert alert["period"] == "day:2026-06-10" and alert["currency"] == "USD" and alert["threshold"] == 0.8
    assert 80 <= float(alert["spend"]) * 1_000_000 <= 100 and alert["budget"] == "0.0001"
    assert alert["api_key_id"] is None
    wall.set("2026-06-11T09:00:00")  # a new period: one more alert when it passes 80 % again
    while refused(replicas[served % 2], "alerted", 9) is None:
        served += 1
    wait_for(lambda: [a["period"] for a in alerts()] == ["day:2026-06-10", "day:2026-06-11"], what="the 2nd alert")
    counted = 0.0
    for gw in replicas:
        for family in text_string_to_metric_families(httpx.get(gw.base_url + "/metrics").text):
            if family.name == "laneway_budget_alerts":
                counted += sum(s.value for s in family.samples if s.name.endswith("_total"))
    assert counted >= 2  # other tests' tenants may have passed theirs too


def refused(gw: Gateway, key: str, max_tokens: int) -> str | None:
    try:
        complete(gw, key, max_tokens=max_tokens)
    except openai.RateLimitError as exc:
        return str(exc.response.json()["error"]["code"])
    return None


def test_memory_mode_refuses_at_the_budget_and_refunds(tmp_path: Path) -> None:
    seed = {"models": {"sim": sim_model("sim", decode_ms_base=0.5)}, "tenants": {"solo": {"budget_per_day": 50}}}
    gw = start_gateway(tmp_path, admin_password=PASSWORD, seed_with=seed)
    try:
        assert admin_client(gw).put("/models/sim/price", json={"input": "1", "output": "1"}).status_code == 200
        served = 0
        while refused(gw, "solo", 9) is None:
            served += 1
        rows = gw.usage_rows("solo")
        per_request = rows[0].cost_micros
        assert served == 50 // per_request and refused(gw, "solo", 9) == "budget_exceeded"
    finally:
        gw.stop()


def test_a_budget_spent_in_part_is_enforced_after_redis_restarts_empty(
    private_redis: PrivateRedis, pg_database: str, tmp_path: Path
) -> None:
    seed = {"models": {"sim": sim_model("sim", decode_ms_base=0.5)}, "tenants": {"lost": {"budget_per_day": 100}}}
    gw = start_gateway(
        tmp_path,
        database_url=pg_database,
        redis_url=private_redis.url,
        seed_with=seed,
        admin_password=PASSWORD,
        usage_flush_interval_s=0.05,
    )
    try:
        gw.gateway.limiter.recovery.late_rows_s = 0.3
        assert admin_client(gw).put("/models/sim/price", json={"input": "1", "output": "1"}).status_code == 200
        spent = sum(complete(gw, "lost").usage.total_tokens for _ in range(3))
        rows = gw.usage_rows
        wait_for(lambda: len(rows("lost")) == 3, what="3 usage rows")
        tenant_id = rows("lost")[0].tenant_id
        name = "cost:" + period("day", gw.gateway.limiter.wall_clock()).name
        assert counter(gw, tenant_id, name) == spent

        private_redis.restart()  # nothing on disk: the budget's counter is gone
        spent += complete(gw, "lost").usage.total_tokens  # begins the day's counter again
        wait_for(lambda: counter(gw, tenant_id, name) == spent, what="the budget counter seeded from the rows")
        served = 4
        while refused(gw, "lost", 9) is None:
            served += 1
        assert served == 100 // (spent // 4)  # refused where it would have been without the loss
    finally:
        gw.stop()
