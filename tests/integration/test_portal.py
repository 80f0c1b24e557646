"""The customer portal over HTTP: a tenant's users see and touch their tenant only, issue keys
within the caps their operator set (and nothing beyond them), revoke them, and read their usage,
limits and refusals; bad names are refused with a clear 400 and nothing is made."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest
from laneway.db.repositories import UsageRepository
from laneway.db.session import make_engine, make_sessionmaker
from support import Gateway, start_gateway, wait_for
from support.accounts import PASSWORD, add_admin, add_portal_user, admin_api, portal_api, tenant_id

SIM = {"sim": [{"name": "sim-a", "engine_kind": "sim", "config": {"decode_ms_base": 0.2}}]}
OTHER = {"other": [{"name": "other-a", "engine_kind": "sim", "config": {"decode_ms_base": 0.2}}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(
        tmp_path_factory.mktemp("portal"),
        seed_with={"models": {**SIM, **OTHER}, "tenants": {"acme": {"rpm": 1000}, "globex": {}}},
        usage_flush_interval_s=0.05,
    )
    add_admin(gw.database_url, "ops", "operator")
    add_portal_user(gw.database_url, "acme", "alice", "tenant-owner")
    add_portal_user(gw.database_url, "acme", "amos", "tenant-member")
    add_portal_user(gw.database_url, "globex", "gina", "tenant-owner")
    yield gw
    gw.stop()


def _add_usage(url: str, tenant: int, key_id: int | None, status: int, code: str | None, n: int) -> None:
    async def write() -> None:
        engine = make_engine(url)
        rows = [
            {
                "request_id": f"seed-{tenant}-{status}-{i}-{datetime.now(UTC).timestamp()}",
                "tenant_id": tenant,
                "api_key_id": key_id,
                "model": "sim",
                "endpoint": "chat",
                "stream": False,
                "status": status,
                "error_code": code,
                "prompt_tokens": 3,
                "completion_tokens": 2 if status == 200 else 0,
                "created_at": datetime.now(UTC),
            }
            for i in range(n)
        ]
        async with make_sessionmaker(engine)() as s, s.begin():
            await UsageRepository(s).add_many(rows)
        await engine.dispose()

    asyncio.run(write())


def test_a_customer_sees_and_touches_only_its_own_tenant(gateway: Gateway) -> None:
    base = gateway.server.base_url
    alice, gina = portal_api(base, "alice"), portal_api(base, "gina")
    mine = alice.post("/keys", json={"name": "ci"})
    assert mine.status_code == 201 and mine.json()["key"].startswith("lw-") and "id" in mine.json()
    theirs = gina.post("/keys", json={"name": "prod"}).json()
    listed = alice.get("/keys").json()["data"]
    assert [k["name"] for k in listed] == ["ci", "acme"]  # newest first; "acme": the seeded key
    assert all("key" not in k and "secret" not in k for k in listed)  # the secret only once
    # Another tenant's key is not found, whether revoking or reading its usage; it stays live.
    assert alice.delete(f"/keys/{theirs['id']}").status_code == 404
    client = openai.OpenAI(base_url=base + "/v1", api_key=theirs["key"], max_retries=0)
    client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    _add_usage(gateway.database_url, tenant_id(gateway.database_url, "globex"), theirs["id"], 200, None, 3)
    usage = alice.get("/usage").json()
    assert usage["totals"]["requests"] == 0 and usage["by_key"] == []
    assert gina.get("/usage").json()["totals"]["requests"] >= 3
    csv = alice.get("/usage.csv")
    assert csv.status_code == 200 and csv.text.count("\n") <= 1  # the header only
    assert alice.get("/me").json() == {"username": "alice", "role": "tenant-owner", "tenant": "acme"}


def test_a_key_is_revoked_and_stops_working(gateway: Gateway) -> None:
    alice = portal_api(gateway.server.base_url, "alice")
    key = alice.post("/keys", json={"name": "rotate-me"}).json()
    client = openai.OpenAI(base_url=gateway.server.base_url + "/v1", api_key=key["key"], max_retries=0)
    client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    revoked = alice.delete(f"/keys/{key['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]

    def refused() -> bool:
        try:
            client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        except openai.AuthenticationError:
            return True
        return False

    wait_for(refused, within=10, step=0.05, what="the revoked key refused")


def test_key_caps_set_by_the_operator_are_kept_and_nothing_beyond_them_is_made(gateway: Gateway) -> None:
    ops = admin_api(gateway.server.base_url, "ops")
    acme = tenant_id(gateway.database_url, "acme")
    caps = {"max_keys": 3, "allowed_models": ["sim"], "max_rpm": 10}
    assert ops.put(f"/tenants/{acme}/portal/caps", json=caps).status_code == 200
    alice = portal_api(gateway.server.base_url, "alice")
    for key in alice.get("/keys").json()["data"]:
        if not key["revoked_at"]:
            alice.delete(f"/keys/{key['id']}")
    before = len(alice.get("/keys").json()["data"])
    for body, param in (
        ({"name": "fast", "rpm": 11}, "rpm"),
        ({"name": "wide", "allowed_models": ["other"]}, "allowed_models"),
    ):
        r = alice.post("/keys", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    capped = alice.post("/keys", json={"name": "capped"}).json()
    assert capped["rpm"] == 10 and capped["allowed_models"] == ["sim"]  # the caps, when not asked for less
    assert alice.post("/keys", json={"name": "slow", "rpm": 5}).json()["rpm"] == 5
    alice.post("/keys", json={"name": "third"})
    over = alice.post("/keys", json={"name": "fourth"})
    assert over.status_code == 409 and "3" in over.json()["error"]["message"]
    assert len(alice.get("/keys").json()["data"]) == before + 3
    portal = ops.get(f"/tenants/{acme}/portal").json()
    assert portal["caps"]["max_keys"] == 3 and {"alice", "amos"} <= {u["username"] for u in portal["users"]}
    assert alice.get("/limits").json()["key_caps"] == {**caps, "max_tpm": None, "max_concurrency": None}
    ops.put(f"/tenants/{acme}/portal/caps", json={"max_keys": 50})


BAD_NAMES: list[tuple[str, Any]] = [
    ("a control character", "ci\x00key"),
    ("a line break", "ci\nkey"),
    ("10 kB", "k" * 10_000),
    ("fullwidth look-alikes", "\uff43\uff49"),
    ("a zero-width space", "c\u200bi"),
    ("a right-to-left override", "ci\u202e"),
]


@pytest.mark.parametrize(("why", "name"), BAD_NAMES, ids=[b[0] for b in BAD_NAMES])
def test_bad_key_names_are_refused_with_a_clear_400_and_no_key_is_made(gateway: Gateway, why: str, name: str) -> None:
    alice = portal_api(gateway.server.base_url, "alice")
    before = alice.get("/keys").json()["data"]
    r = alice.post("/keys", json={"name": name})
    assert r.status_code == 400 and r.json()["error"]["param"] == "name", why
    assert len(r.json()["error"]["message"]) < 200
    assert alice.get("/keys").json()["data"] == before


@pytest.mark.parametrize("username", ["\u0430lice2", "al\x00ice", "a" * 10_000, "two words", "\uff41lice"])
def test_bad_portal_user_names_are_refused_and_nobody_is_made(gateway: Gateway, username: str) -> None:
    ops = admin_api(gateway.server.base_url, "ops")
    acme = tenant_id(gateway.database_url, "acme")
    r = ops.post(
        f"/tenants/{acme}/portal/users", json={"username": username, "password": PASSWORD, "role": "tenant-member"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "username"
    assert len(ops.get(f"/tenants/{acme}/portal").json()["users"]) == 2


def test_refusals_are_counted_by_code_with_the_reason_in_words(gateway: Gateway) -> None:
    acme = tenant_id(gateway.database_url, "acme")
    _add_usage(gateway.database_url, acme, None, 429, "quota_exceeded", 4)
    _add_usage(gateway.database_url, acme, None, 503, "queue_full", 1)
    _add_usage(gateway.database_url, tenant_id(gateway.database_url, "globex"), None, 429, "rate_limit_exceeded", 2)
    alice = portal_api(gateway.server.base_url, "alice")
    found = {r["code"]: r for r in alice.get("/refusals").json()["data"]}
    assert set(found) == {"quota_exceeded", "queue_full"}  # globex's are not acme's
    assert found["quota_exceeded"]["count"] == 4 and found["quota_exceeded"]["status"] == 429
    assert "quota" in found["quota_exceeded"]["reason"] and "queue" in found["queue_full"]["reason"]
    limits = alice.get("/limits").json()
    assert limits["rate"]["rpm"] == 1000 and set(limits["quotas"]) == {"day", "month"}
    assert limits["quotas"]["day"]["resets_at"] and set(limits["budgets"]) == {"day", "month"}


def test_a_member_reads_but_cannot_issue_revoke_or_invite(gateway: Gateway) -> None:
    amos = portal_api(gateway.server.base_url, "amos")
    assert amos.get("/keys").status_code == 200 and amos.get("/usage").status_code == 200
    assert amos.post("/keys", json={"name": "mine"}).status_code == 403
    body = {"username": "friend", "password": PASSWORD, "role": "tenant-owner"}
    assert amos.post("/users", json=body).status_code == 403
    alice = portal_api(gateway.server.base_url, "alice")
    made = alice.post("/users", json={**body, "role": "tenant-member"})
    assert made.status_code == 201 and made.json()["tenant"] == "acme"


def test_the_portal_login_is_throttled_and_changes_need_the_csrf_token(gateway: Gateway) -> None:
    base = gateway.server.base_url + "/portal/api"
    alice = portal_api(gateway.server.base_url, "alice")
    r = alice.post("/keys", json={"name": "forged"}, headers={"X-CSRF-Token": "nope"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
    statuses = [
        httpx.post(base + "/login", json={"username": "gina", "password": "wrong password"}, timeout=30).status_code
        for _ in range(7)
    ]
    assert statuses[:5] == [401] * 5 and 429 in statuses[5:]
