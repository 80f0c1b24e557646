"""Admin accounts with roles and customer portal users, made through the same operations the
CLI runs (admin/accounts.py, portal/accounts.py), and httpx clients logged in as them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from laneway.admin.service import AdminService
from laneway.db.repositories import TenantRepository
from laneway.db.session import make_engine

PASSWORD = "correct horse battery"
# A login's argon2 check waits its turn in one thread: generous on a loaded machine.
TIMEOUT_S = 30.0


def _with_service(url: str, work: Callable[[AdminService], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        engine = make_engine(url)
        try:
            return await work(AdminService.not_serving(engine))
        finally:
            await engine.dispose()

    return asyncio.run(run())


def add_admin(url: str, username: str, role: str) -> None:
    from laneway.admin.accounts import create_admin

    _with_service(url, lambda svc: create_admin(svc, "test", username, PASSWORD, role))


def tenant_id(url: str, name: str) -> int:
    async def find(svc: AdminService) -> int:
        async with svc.sessions() as s:
            tenant = await TenantRepository(s).get_by_name(name)
        assert tenant is not None
        return int(tenant.id)

    return int(_with_service(url, find))


def add_portal_user(url: str, tenant: str, username: str, role: str) -> None:
    from laneway.portal.accounts import create_portal_user

    tid = tenant_id(url, tenant)
    _with_service(url, lambda svc: create_portal_user(svc, "test", tid, username, PASSWORD, role))


def admin_api(base_url: str, username: str) -> httpx.Client:
    """A client of /admin/api logged in as `username`, its CSRF token in every request."""
    client = httpx.Client(base_url=base_url + "/admin/api", timeout=TIMEOUT_S)
    r = client.post("/login", json={"username": username, "password": PASSWORD})
    assert r.status_code == 200, r.text
    client.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    return client


def portal_api(base_url: str, username: str) -> httpx.Client:
    client = httpx.Client(base_url=base_url + "/portal/api", timeout=TIMEOUT_S)
    r = client.post("/login", json={"username": username, "password": PASSWORD})
    assert r.status_code == 200, r.text
    client.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    return client
