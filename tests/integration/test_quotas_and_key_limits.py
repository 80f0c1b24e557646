"""Token quotas per UTC day and month, and per-key limits, through real servers: two gateway
replicas on one PostgreSQL database and one Redis enforce one quota between them, the
official openai SDK sees OpenAI's error shape, and the admin API edits them (validated in
plain words, audited) with the next request obeying. The limiters' wall clock is injected,
so crossing midnight or the 1st takes no waiting."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import REDIS_URL, Gateway, KeySpec, Wall, replica_pair, require_service, sim_model, start_gateway, wait_for

PASSWORD = "correct horse battery"
TENANTS = {
    "daily": {"tokens_per_day": 100},
    "monthly": {"tokens_per_month": 100, "tokens_per_day": 1000},
    "keyed": {"rpm": 1000, "allowed_models": ["sim", "other", "slow"]},
    "edited": {},
}
KEYS = {
    "daily": KeySpec("daily"),
    "monthly": KeySpec("monthly"),
    "keyed-narrow": KeySpec("keyed"),
    "keyed-wide": KeySpec("keyed"),
    "edited": KeySpec("edited"),
}


def _seed() -> dict[str, Any]:
    slow = sim_model("other", decode_ms_base=0.5)
    return {
        "models": {
            "sim": sim_model("sim", decode_ms_base=0.5, max_concurrency=64),
            "slow": sim_model("slow", decode_ms_base=40.0, max_concurrency=64),
            "other": slow,
        },
        "lanes": [{"name": "standard", "max_concurrency": 64, "max_queue_depth": 100, "queue_timeout_s": 30}],
        "tenants": TENANTS,
        "keys": KEYS,
    }


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, pg_database_module: str) -> Iterator[list[Gateway]]:
    """Two replicas sharing one PostgreSQL database and one Redis prefix."""
    require_service("Redis", "127.0.0.1", 6379)
    shared: dict[str, Any] = {
        "database_url": pg_database_module,
        "redis_url": REDIS_URL,
        "redis_prefix": f"lwtest:{uuid.uuid4().hex}:",
        "admin_password": PASSWORD,
        "usage_flush_interval_s": 0.05,
    }
    with replica_pair(
        lambda: start_gateway(tmp_path_factory.mktemp("a"), seed_with=_seed(), **shared),
        lambda: start_gateway(tmp_path_factory.mktemp("b"), **shared),
    ) as pair:  # b: a's schema, rows
        yield pair


@pytest.fixture
def wall(replicas: list[Gateway]) -> Iterator[Wall]:
    clock = Wall()
    for gw in replicas:
        gw.gateway.limiter.wall_clock = clock
    yield clock
    for gw in replicas:
        gw.gateway.limiter.wall_clock = time.time


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys[key], max_retries=0)


def complete(gw: Gateway, key: str, model: str = "sim", max_tokens: int = 9) -> Any:
    return client(gw, key).completions.create(model=model, prompt="hi", max_tokens=max_tokens)


def settled(replicas: list[Gateway]) -> None:
    for gw in replicas:
        assert gw.server.call(gw.gateway.limiter.settled())


@pytest.mark.parametrize(
    ("tenant", "at", "retry_after", "reset", "after_reset"),
    [
        ("daily", "2026-03-30T23:59:00", 60, "2026-03-31T00:00:00Z", "2026-03-31T00:00:01"),
        ("monthly", "2026-03-31T12:00:00", 12 * 3600, "2026-04-01T00:00:00Z", "2026-04-01T00:00:00"),
    ],
)
def test_two_replicas_share_one_quota_until_its_utc_reset(
    replicas: list[Gateway], wall: Wall, tenant: str, at: str, retry_after: int, reset: str, after_reset: str
) -> None:
    wall.set(at)
    used, served = 0, 0
    for i in range(20):  # alternating replicas until the quota refuses
        gw = replicas[i % 2]
        try:
            usage = complete(gw, tenant).usage
        except openai.RateLimitError as exc:
            error = exc.response.json()["error"]
            assert error["code"] == "quota_exceeded" and error["type"] == "rate_limit_error"
            assert "quota of 100 tokens" in error["message"] and reset in error["message"]
            assert exc.response.headers["retry-after"] == str(retry_after)
            assert exc.response.headers["x-laneway-quota-reset"] == reset
            break
        used, served = used + usage.total_tokens, served + 1
        per_request = usage.total_tokens
    else:
        pytest.fail("the quota never refused")
    # Refused once the replicas together could not fit one more request in 100 tokens.
    assert served == 100 // per_request and served >= 2 and used + per_request > 100 >= used
    other = replicas[served % 2 - 1]  # the other replica refuses too: one counter, not two
    with pytest.raises(openai.RateLimitError):
        complete(other, tenant)
    wall.set(at[:11] + "23:59:59" if tenant == "daily" else "2026-03-31T23:59:59")
    with pytest.raises(openai.RateLimitError):
        complete(replicas[0], tenant)  # a second before the reset: still refused
    wall.set(after_reset)
    assert complete(replicas[1], tenant).usage.total_tokens == per_request


def test_a_days_rollover_keeps_the_months_count(replicas: list[Gateway], wall: Wall) -> None:
    """Monthly tenant: its day quota is 1000, so only the month binds, across days."""
    wall.set("2026-05-01T08:00:00")
    per_request = complete(replicas[0], "monthly", max_tokens=40).usage.total_tokens
    wall.set("2026-05-02T08:00:00")
    complete(replicas[1], "monthly", max_tokens=40)
    wall.set("2026-05-03T08:00:00")
    assert 3 * per_request > 100
    with pytest.raises(openai.RateLimitError) as info:
        complete(replicas[0], "monthly", max_tokens=40)
    assert info.value.response.headers["x-laneway-quota-reset"] == "2026-06-01T00:00:00Z"


def test_a_key_limited_to_one_model_gets_403_on_another_the_tenant_may_use(replicas: list[Gateway]) -> None:
    a, b = replicas
    admin = admin_client(a)
    key_id = key_named(admin, "keyed", "keyed-narrow")
    r = admin.patch(f"/keys/{key_id}", json={"allowed_models": ["sim"], "rpm": 3})
    assert r.status_code == 200 and r.json()["allowed_models"] == ["sim"] and r.json()["rpm"] == 3
    # Replica b hears of it by NOTIFY: its next request obeys.
    wait_for(lambda: refused(b, "keyed-narrow", "other") == 403, what="replica b applying the key's models")
    with pytest.raises(openai.PermissionDeniedError) as info:
        complete(a, "keyed-narrow", model="other")
    error = info.value.response.json()["error"]
    assert error["code"] == "model_not_allowed" and error["param"] == "model"
    assert complete(a, "keyed-wide", model="other").usage.completion_tokens == 9  # the tenant may use it
    models = {m.id for m in client(b, "keyed-narrow").models.list()}
    assert models == {"sim"}  # /v1/models lists what the key may use


def test_key_rpm_is_shared_by_the_replicas_and_leaves_the_tenants_other_keys_alone(replicas: list[Gateway]) -> None:
    a, b = replicas
    admin = admin_client(a)
    key_id = key_named(admin, "keyed", "keyed-narrow")
    admin.patch(f"/keys/{key_id}", json={"rpm": 2, "allowed_models": None})
    wait_for(lambda: b.server.runtime.config_changes.received >= 1, what="replica b's NOTIFY")
    statuses = []
    for i in range(4):
        statuses.append(refused(replicas[i % 2], "keyed-narrow", "sim") or 200)
    assert statuses[:2] == [200, 200] and statuses[2:] == [429, 429]
    with pytest.raises(openai.RateLimitError) as info:
        complete(b, "keyed-narrow")
    assert info.value.response.json()["error"]["code"] == "rate_limit_exceeded"
    assert "this API key" in info.value.response.json()["error"]["message"]
    assert int(info.value.response.headers["retry-after"]) >= 1
    for gw in replicas:
        complete(gw, "keyed-wide")  # the tenant's other key has its own bucket
    admin.patch(f"/keys/{key_id}", json={"rpm": None})  # cleared: the tenant's 1000/min apply
    wait_for(lambda: refused(b, "keyed-narrow", "sim") is None, what="the cleared key limit")


def test_key_concurrency_and_tpm(replicas: list[Gateway]) -> None:
    a, b = replicas
    admin = admin_client(a)
    key_id = key_named(admin, "keyed", "keyed-narrow")
    assert admin.patch(f"/keys/{key_id}", json={"max_concurrency": 1, "tpm": 500}).status_code == 200
    wait_for(lambda: refused(b, "keyed-narrow", "sim", max_tokens=600) == 429, what="the key's TPM on b")
    with pytest.raises(openai.RateLimitError) as info:
        complete(b, "keyed-narrow", max_tokens=600)
    assert info.value.response.json()["error"]["code"] == "request_too_large"
    headers = {"Authorization": f"Bearer {a.keys['keyed-narrow']}"}
    body = {"model": "slow", "prompt": "hi", "max_tokens": 100, "stream": True}
    with httpx.stream("POST", a.api_url + "/completions", headers=headers, json=body, timeout=30) as running:
        assert running.status_code == 200
        lines = running.iter_lines()  # kept: a dropped iterator closes the response
        assert next(lines).startswith("data: ")  # generating on replica a
        with pytest.raises(openai.RateLimitError) as info:
            complete(b, "keyed-narrow")  # replica b sees the key's one slot taken
        assert info.value.response.json()["error"]["code"] == "concurrency_limit_exceeded"
        complete(b, "keyed-wide")
    # The stream was cut: its slot comes back (the settle is sent in the background).
    wait_for(lambda: refused(b, "keyed-narrow", "sim") is None, what="the key's slot back")
    admin.patch(f"/keys/{key_id}", json={"max_concurrency": None, "tpm": None})


def test_memory_mode_enforces_the_daily_quota(tmp_path: Path) -> None:
    gw = start_gateway(
        tmp_path,
        seed_with={
            "models": {"sim": sim_model("sim", decode_ms_base=0.5)},
            "tenants": {"solo": {"tokens_per_day": 30}},
        },
    )
    try:
        clock = Wall()
        clock.set("2026-07-14T22:00:00")
        gw.gateway.limiter.wall_clock = clock
        served = 0
        while True:
            try:
                complete(gw, "solo")
                served += 1
            except openai.RateLimitError as exc:
                assert exc.response.json()["error"]["code"] == "quota_exceeded"
                assert exc.response.headers["retry-after"] == "7200"
                assert exc.response.headers["x-laneway-quota-reset"] == "2026-07-15T00:00:00Z"
                break
            assert served < 10, "the quota never refused"
        assert served >= 1
        clock.set("2026-07-15T00:00:00")
        complete(gw, "solo")
    finally:
        gw.stop()


def test_memory_mode_counts_the_day_from_the_usage_table_after_a_restart(tmp_path: Path) -> None:
    """Real wall clock: the rows of the first process are today's (a run across 00:00 UTC would not be)."""
    gw = start_gateway(
        tmp_path,
        seed_with={
            "models": {"sim": sim_model("sim", decode_ms_base=0.5)},
            "tenants": {"solo": {"tokens_per_day": 25}},
        },
    )
    keys = gw.keys
    try:
        complete(gw, "solo")
        complete(gw, "solo")  # 20 of 25 tokens
    finally:
        gw.stop()  # drains and writes the usage rows
    again = start_gateway(tmp_path)
    again.keys = keys
    try:
        with pytest.raises(openai.RateLimitError) as info:
            complete(again, "solo")  # a fresh process, not a fresh quota
        assert info.value.response.json()["error"]["code"] == "quota_exceeded"
        assert "used 20 of its daily quota of 25" in info.value.response.json()["error"]["message"]
    finally:
        again.stop()


def test_admin_edits_quotas_and_key_limits_with_plain_word_errors(replicas: list[Gateway], wall: Wall) -> None:
    a, _ = replicas
    admin = admin_client(a)
    tenant_id = tenant_named(admin, "edited")
    for body, param, words in [
        ({"tokens_per_day": 0}, "tokens_per_day", "tokens_per_day must be a whole number of tokens from 1"),
        ({"tokens_per_month": -5}, "tokens_per_month", "per calendar month in UTC"),
        ({"tokens_per_day": "lots"}, "tokens_per_day", "tokens_per_day must be a whole number"),
        ({"tokens_per_month": 10**16}, "tokens_per_month", "1,000,000,000,000,000"),
    ]:
        r = admin.patch(f"/tenants/{tenant_id}", json=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"], r.json()
    r = admin.patch(f"/tenants/{tenant_id}", json={"tokens_per_day": 50, "tokens_per_month": 3_000_000_000, "rpm": 10})
    assert r.status_code == 200 and r.json()["tokens_per_month"] == 3_000_000_000  # past 2**31: BIGINT
    key_id = key_named(admin, "edited", "edited")
    for body, param, words in [
        ({"rpm": 11}, "rpm", "rpm 11 is above tenant 'edited''s RPM of 10"),
        ({"rpm": 0}, "rpm", "rpm must be a whole number, at least 1"),
        ({"allowed_models": []}, "allowed_models", "must name at least one model"),
        ({"burst": 3}, "burst", "burst is not a field this accepts"),
    ]:
        r = admin.patch(f"/keys/{key_id}", json=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"], r.json()
    assert admin.patch(f"/keys/{key_id}", json={"rpm": 5}).json()["rpm"] == 5
    # Issuing a key with limits validates them first: nothing issued when refused.
    before = len(admin.get(f"/tenants/{tenant_id}/keys").json()["data"])
    r = admin.post(f"/tenants/{tenant_id}/keys", json={"name": "too-wide", "rpm": 50})
    assert r.status_code == 400 and len(admin.get(f"/tenants/{tenant_id}/keys").json()["data"]) == before
    issued = admin.post(f"/tenants/{tenant_id}/keys", json={"name": "narrow", "tpm": 40, "allowed_models": ["sim"]})
    assert issued.status_code == 201 and issued.json()["tpm"] == 40 and issued.json()["allowed_models"] == ["sim"]

    wait_for(lambda: refused(a, "edited", "sim") is None, what="the edited tenant serving")  # counted today
    wall.set("2026-08-20T10:00:00")
    used = complete(a, "edited").usage.total_tokens
    settled(replicas)
    usage = admin.get(f"/tenants/{tenant_id}/usage").json()
    assert usage["source"] == "limiter"
    assert usage["day"] == {
        "period": "2026-08-20",
        "used": used,
        "limit": 50,
        "left": 50 - used,
        "resets_at": "2026-08-21T00:00:00Z",
    }
    assert usage["month"]["used"] == used and usage["month"]["resets_at"] == "2026-09-01T00:00:00Z"
    audit = admin.get("/audit").json()
    key_edit = next(e for e in audit if e["entity"] == "api_key" and e["action"] == "update")
    assert key_edit["after"]["rpm"] == 5 and key_edit["actor"] == "admin"
    quota_edit = next(e for e in audit if e["entity"] == "tenant" and (e["after"] or {}).get("tokens_per_day") == 50)
    assert quota_edit["before"]["tokens_per_day"] is None


# ---- helpers ----
def refused(gw: Gateway, key: str, model: str, max_tokens: int = 9) -> int | None:
    """The status of a refused request (None when served)."""
    r = httpx.post(
        gw.api_url + "/completions",
        headers={"Authorization": f"Bearer {gw.keys[key]}"},
        json={"model": model, "prompt": "hi", "max_tokens": max_tokens},
        timeout=10,
    )
    return None if r.status_code == 200 else r.status_code


def admin_client(gw: Gateway) -> httpx.Client:
    admin = httpx.Client(base_url=gw.base_url + "/admin/api", timeout=10)
    r = admin.post("/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200
    admin.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    return admin


def tenant_named(admin: httpx.Client, name: str) -> int:
    return int(next(t["id"] for t in admin.get("/tenants", params={"q": name}).json()["data"] if t["name"] == name))


def key_named(admin: httpx.Client, tenant: str, key: str) -> int:
    keys = admin.get(f"/tenants/{tenant_named(admin, tenant)}/keys").json()["data"]
    return int(next(k["id"] for k in keys if k["name"] == key))
