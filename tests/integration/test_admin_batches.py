"""Batches on the operators' side (issue 25): the admin service lists every tenant's batches
newest first, a page at a time, with the tenant's name and progress, and cancels any tenant's
batch with an audit row written in the cancel's own transaction (SQLite and PostgreSQL); the
JSON API and the page do it behind an admin session and its CSRF token."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from laneway.admin import batches
from laneway.admin.service import AdminService
from laneway.contracts.errors import GatewayError
from laneway.db.batch_records import BatchInfo
from laneway.db.batch_store import BatchStore
from laneway.db.models import AuditEntry
from laneway.db.repositories import AuditRepository, TenantRepository
from laneway.db.session import make_engine, make_sessionmaker
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from support import Gateway, sim_model, start_gateway

PASSWORD = "correct horse battery"
START = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)  # each batch a second newer than the one before
        return self.now


async def make_batch(store: BatchStore, tenant_id: int, n: int = 2) -> str:
    items = [(f"req-{i}", json.dumps({"model": "m", "messages": [], "n": i})) for i in range(n)]
    created = await store.create_batch(
        tenant_id, "k" * 64, "/v1/chat/completions", "file-in", "24h", None, START + timedelta(days=30), items
    )
    return created.id


@dataclass
class Env:
    svc: AdminService
    store: BatchStore
    acme: int
    other: int

    async def audit_rows(self) -> list[AuditEntry]:
        async with self.svc.sessions() as session:
            return [e for e in await AuditRepository(session).recent(100) if e.entity == "batch"]


@pytest.fixture
async def env(db_engine: AsyncEngine) -> AsyncIterator[Env]:
    svc = AdminService.not_serving(db_engine)
    async with svc.sessions() as s, s.begin():
        acme = (await TenantRepository(s).create("acme")).id
        other = (await TenantRepository(s).create("other")).id
    yield Env(svc, BatchStore(svc.sessions, clock=Clock()), acme, other)


async def test_every_tenants_batches_newest_first_a_page_at_a_time(env: Env) -> None:
    first = await make_batch(env.store, env.acme, 3)
    theirs = await make_batch(env.store, env.other, 1)
    newest = await make_batch(env.store, env.acme, 2)
    (item,) = await env.store.claim(first, "replica-a", 1, 60)  # one answered, one failed: 2 of 3 done
    await env.store.finish(item.id, "replica-a", "succeeded", "{}")
    (item,) = await env.store.claim(first, "replica-a", 1, 60)
    await env.store.finish(item.id, "replica-a", "failed", "{}")

    page = await batches.list_batches(env.svc, limit=2)
    assert [(b["id"], b["tenant"]) for b in page["data"]] == [(newest, "acme"), (theirs, "other")]
    assert page["has_more"] is True and page["last_id"] == theirs
    rest = await batches.list_batches(env.svc, after=page["last_id"], limit=2)
    assert [b["id"] for b in rest["data"]] == [first] and rest["has_more"] is False
    shown = rest["data"][0]
    assert shown["request_counts"] == {"total": 3, "completed": 1, "failed": 1} and shown["done"] == 2
    assert (shown["status"], shown["endpoint"], shown["cancellable"]) == ("in_progress", "/v1/chat/completions", True)
    assert datetime.fromisoformat(shown["created_at"]) < datetime.fromisoformat(shown["expires_at"])

    mine = await batches.list_batches(env.svc, "acme")
    assert [b["id"] for b in mine["data"]] == [newest, first]
    assert await batches.tenants_with_batches(env.svc) == ["acme", "other"]
    with pytest.raises(GatewayError) as refused:
        await batches.list_batches(env.svc, "nobody")
    assert (refused.value.status, refused.value.param) == (404, "tenant")
    with pytest.raises(GatewayError) as refused:
        await batches.list_batches(env.svc, limit=101)
    assert (refused.value.status, refused.value.param) == (400, "limit")


async def test_a_cancel_of_any_tenants_batch_is_audited_once(env: Env) -> None:
    batch_id = await make_batch(env.store, env.other, 2)
    cancelled = await batches.cancel_batch(env.svc, "alice", batch_id)
    assert (cancelled["status"], cancelled["tenant"], cancelled["cancellable"]) == ("cancelling", "other", False)
    assert cancelled["cancelling_at"] is not None
    (entry,) = await env.audit_rows()
    assert (entry.actor, entry.action, entry.entity_id) == ("alice", "cancel", batch_id)
    assert (entry.before, entry.after) == ({"status": "in_progress"}, {"status": "cancelling"})
    # Its pending items were cancelled: none is handed to a runner.
    assert await env.store.claim(batch_id, "replica-a", 10, 60) == []

    again = await batches.cancel_batch(env.svc, "bob", batch_id)  # nothing changes, nothing audited
    assert again["status"] == "cancelling" and len(await env.audit_rows()) == 1

    with pytest.raises(GatewayError) as refused:
        await batches.cancel_batch(env.svc, "alice", "batch_unknown")
    assert (refused.value.status, refused.value.code.value) == (404, "not_found")


async def test_an_ended_batch_cannot_be_cancelled(env: Env) -> None:
    batch_id = await make_batch(env.store, env.acme, 1)
    for item in await env.store.claim(batch_id, "replica-a", 10, 60):
        await env.store.finish(item.id, "replica-a", "succeeded", "{}")
    assert await env.store.to_finalize("replica-a", 60) == [batch_id]
    assert await env.store.complete(batch_id, "replica-a", "completed", b"{}\n", None) is not None
    with pytest.raises(GatewayError) as refused:
        await batches.cancel_batch(env.svc, "alice", batch_id)
    assert refused.value.status == 409 and "completed" in refused.value.message
    assert await env.audit_rows() == []
    listed = (await batches.list_batches(env.svc))["data"][0]
    assert (listed["status"], listed["cancellable"], listed["done"]) == ("completed", False, 1)


async def test_an_audit_row_that_cannot_be_written_undoes_the_cancel(env: Env) -> None:
    batch_id = await make_batch(env.store, env.acme, 2)

    async def failing_audit(session: AsyncSession, batch: BatchInfo) -> None:
        assert batch.status == "cancelling"  # the change is made, in this transaction
        raise RuntimeError("audit table unavailable")

    with pytest.raises(RuntimeError):
        await env.store.cancel(None, batch_id, on_cancelled=failing_audit)
    left = await env.store.get_batch(None, batch_id)
    assert left is not None and left.status == "in_progress"
    assert len(await env.store.claim(batch_id, "replica-a", 10, 60)) == 2  # still pending


# ---- through the server: the JSON API and the page ----


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    seed = {"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}, "other": {}}}  # ready once sim is warm
    # No runner: the batches stay as the tests made them.
    gateway = start_gateway(
        tmp_path_factory.mktemp("batches"), seed_with=seed, admin_password=PASSWORD, batch_runner=False
    )
    yield gateway
    gateway.stop()


def batch_of(gw: Gateway, tenant: str, n: int = 2) -> str:
    async def go() -> str:
        engine = make_engine(gw.database_url)
        try:
            sessions = make_sessionmaker(engine)
            async with sessions() as s:
                found = await TenantRepository(s).get_by_name(tenant)
            assert found is not None
            return await make_batch(BatchStore(sessions), found.id, n)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def logged_in(gw: Gateway) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=gw.base_url)
    r = client.post("/admin/api/login", json={"username": "admin", "password": PASSWORD})
    assert r.status_code == 200
    return client, r.json()["csrf_token"]


def test_the_api_lists_and_cancels_behind_a_session_and_its_csrf_token(gw: Gateway) -> None:
    ours, theirs = batch_of(gw, "acme", 3), batch_of(gw, "other")
    anon = httpx.Client(base_url=gw.base_url)
    assert anon.get("/admin/api/batches").status_code == 401
    assert anon.post(f"/admin/api/batches/{ours}/cancel").status_code == 401
    bearer = {"Authorization": f"Bearer {gw.keys['acme']}"}  # a tenant's API key is no admin
    assert anon.get("/admin/api/batches", headers=bearer).status_code == 401

    admin, csrf = logged_in(gw)
    listed = admin.get("/admin/api/batches").json()
    assert [(b["id"], b["tenant"]) for b in listed["data"][:2]] == [(theirs, "other"), (ours, "acme")]
    only = admin.get("/admin/api/batches", params={"tenant": "acme"}).json()["data"]
    assert ours in [b["id"] for b in only] and theirs not in [b["id"] for b in only]
    page = admin.get("/admin/api/batches", params={"limit": 1}).json()
    assert page["has_more"] and page["last_id"] == theirs
    after = admin.get("/admin/api/batches", params={"limit": 1, "after": theirs}).json()
    assert after["data"][0]["id"] == ours
    r = admin.get("/admin/api/batches", params={"limit": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
    assert admin.get("/admin/api/batches", params={"tenant": "nobody"}).status_code == 404

    forged = admin.post(f"/admin/api/batches/{ours}/cancel", headers={"X-CSRF-Token": "forged"})
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "csrf_failed"
    assert admin.get("/admin/api/batches", params={"tenant": "acme"}).json()["data"][0]["status"] == "in_progress"
    r = admin.post(f"/admin/api/batches/{ours}/cancel", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200 and r.json()["status"] == "cancelling" and r.json()["tenant"] == "acme"
    missing = admin.post("/admin/api/batches/batch_nope/cancel", headers={"X-CSRF-Token": csrf})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    entry = next(e for e in admin.get("/admin/api/audit").json() if e["entity"] == "batch")
    assert (entry["actor"], entry["action"], entry["entity_id"]) == ("admin", "cancel", ours)
    assert (entry["before"], entry["after"]) == ({"status": "in_progress"}, {"status": "cancelling"})


def test_the_page_lists_filters_and_cancels(gw: Gateway) -> None:
    batch_id = batch_of(gw, "other", 4)
    admin, csrf = logged_in(gw)
    assert httpx.get(gw.base_url + "/admin/batches").status_code == 303  # to the login
    page = admin.get("/admin/batches", params={"tenant": "other"})
    assert page.status_code == 200 and f'<tr id="batch-{batch_id}" data-status="in_progress">' in page.text
    assert re.search(r'<option value="other" selected>other</option>', page.text)
    assert f'action="/admin/batches/{batch_id}/cancel"' in page.text and "0 / 4" in page.text
    assert 'href="/admin/batches" aria-current="page"' in page.text  # the nav link
    panel = admin.get("/admin/batches/panel", params={"tenant": "other"})
    assert panel.status_code == 200 and 'hx-trigger="every 5s"' in panel.text and batch_id in panel.text
    unknown = admin.get("/admin/batches", params={"tenant": "nobody"})
    assert unknown.status_code == 404 and "No tenant named" in unknown.text

    form = {"tenant": "other", "after": ""}
    assert admin.post(f"/admin/batches/{batch_id}/cancel", data=form).status_code == 403  # no CSRF token
    done = admin.post(f"/admin/batches/{batch_id}/cancel", data={**form, "csrf_token": csrf})
    assert done.status_code == 200 and f"Batch {batch_id} of other is cancelling" in done.text
    assert f'<tr id="batch-{batch_id}" data-status="cancelling">' in done.text
    assert f'action="/admin/batches/{batch_id}/cancel"' not in done.text  # no Cancel button any more
    assert done.headers["HX-Replace-Url"] == "/admin/batches?tenant=other"
