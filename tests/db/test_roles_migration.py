"""Migration 0017 on SQLite and PostgreSQL: an admin from before is an owner (nobody loses what
it could do), and a tenant's portal users and key caps go with the tenant."""

from laneway.db import migrate
from laneway.db.portal_repositories import PortalUserRepository, TenantKeys
from laneway.db.portal_tables import PortalKeyCaps, PortalUser
from laneway.db.repositories import TenantRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine


async def test_an_admin_from_before_is_an_owner(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0016")
    async with db_engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO admins (username, password_hash, created_at) VALUES ('old', 'x', CURRENT_TIMESTAMP)")
        )
    await migrate.upgrade(db_engine)
    async with db_engine.connect() as conn:
        assert (await conn.execute(text("SELECT role FROM admins WHERE username = 'old'"))).scalar_one() == "owner"


async def test_portal_users_and_caps_go_with_their_tenant_and_keys_stay_in_theirs(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        tenants = TenantRepository(s)
        acme, globex = await tenants.create("acme"), await tenants.create("globex")
        theirs = await tenants.add_key(globex, prefix="lw-x", secret_sha256="e" * 64)
        await PortalUserRepository(s).create(acme.id, "alice", "hash", "tenant-owner")
        s.add(PortalKeyCaps(tenant_id=acme.id, max_keys=2))
    async with sessions() as s:
        assert await TenantKeys(s, acme.id).get(theirs.id) is None  # another tenant's key is not found
        assert await TenantKeys(s, globex.id).get(theirs.id) is not None
    async with sessions() as s, s.begin():
        if db_engine.dialect.name == "sqlite":
            await s.execute(text("PRAGMA foreign_keys = ON"))
        await s.delete(await s.get(type(acme), acme.id))
    async with sessions() as s:
        assert (await s.execute(select(func.count()).select_from(PortalUser))).scalar_one() == 0
        assert (await s.execute(select(func.count()).select_from(PortalKeyCaps))).scalar_one() == 0
