"""Reads and writes of the customer portal's tables (db/portal_tables.py). Every read of a
tenant's keys takes the tenant: a portal user's queries are scoped by tenant here, below the
pages, so no caller can forget it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from laneway.db.models import ApiKey, UsageRecord, utcnow
from laneway.db.portal_tables import PortalKeyCaps, PortalSession, PortalUser


class PortalUserRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def create(self, tenant_id: int, username: str, password_hash: str, role: str) -> PortalUser:
        user = PortalUser(tenant_id=tenant_id, username=username, password_hash=password_hash, role=role)
        self.session.add(user)
        await self.session.flush()
        return user

    async def get_by_username(self, username: str) -> PortalUser | None:
        stmt = select(PortalUser).where(PortalUser.username == username)
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def of_tenant(self, tenant_id: int) -> Sequence[PortalUser]:
        stmt = select(PortalUser).where(PortalUser.tenant_id == tenant_id).order_by(PortalUser.username)
        return (await self.session.execute(stmt)).scalars().all()

    async def open_session(self, user: PortalUser, token_sha256: str, csrf_token: str, expires_at: datetime) -> None:
        user.last_login_at = utcnow()
        self.session.add(
            PortalSession(user_id=user.id, token_sha256=token_sha256, csrf_token=csrf_token, expires_at=expires_at)
        )
        await self.session.flush()

    async def find_session(self, token_sha256: str) -> PortalSession | None:
        stmt = (
            select(PortalSession)
            .options(selectinload(PortalSession.user).selectinload(PortalUser.tenant))
            .where(PortalSession.token_sha256 == token_sha256)
        )
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def close_session(self, token_sha256: str) -> None:
        found = await self.find_session(token_sha256)
        if found is not None:
            await self.session.delete(found)


class TenantKeys:
    """One tenant's API keys, and only that tenant's: a key of another tenant is not found."""

    def __init__(self, session: AsyncSession, tenant_id: int) -> None:
        self.session = session
        self.tenant_id = tenant_id

    async def page(self, *, after: int | None, limit: int) -> Sequence[ApiKey]:
        """Newest first, `limit` at most, those older than key `after` (the page before's last)."""
        stmt = select(ApiKey).where(ApiKey.tenant_id == self.tenant_id)
        if after is not None:
            stmt = stmt.where(ApiKey.id < after)
        return (await self.session.execute(stmt.order_by(ApiKey.id.desc()).limit(limit))).scalars().all()

    async def get(self, key_id: int) -> ApiKey | None:
        stmt = select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == self.tenant_id)
        return (await self.session.execute(stmt)).scalar_one_or_none()

    async def live_count(self, now: datetime) -> int:
        live = and_(
            ApiKey.tenant_id == self.tenant_id,
            ApiKey.revoked_at.is_(None),
            or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now),
        )
        return int((await self.session.execute(select(func.count()).where(live))).scalar_one())

    async def names(self, key_ids: Sequence[int]) -> dict[int, str]:
        if not key_ids:
            return {}
        stmt = select(ApiKey.id, ApiKey.name).where(ApiKey.tenant_id == self.tenant_id, ApiKey.id.in_(key_ids))
        return {int(i): str(n) for i, n in (await self.session.execute(stmt)).all()}


async def key_caps(session: AsyncSession, tenant_id: int) -> PortalKeyCaps | None:
    return await session.get(PortalKeyCaps, tenant_id)


async def refusals_since(session: AsyncSession, tenant_id: int, since: datetime) -> list[tuple[int, str, int, Any]]:
    """The tenant's refused requests (429, 503) since `since`: (status, code, how many, the
    last one's time), most frequent first; one aggregate on the (tenant_id, created_at) index."""
    refused = and_(
        UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= since, UsageRecord.status.in_((429, 503))
    )
    stmt = (
        select(UsageRecord.status, UsageRecord.error_code, func.count(), func.max(UsageRecord.created_at))
        .where(refused)
        .group_by(UsageRecord.status, UsageRecord.error_code)
        .order_by(func.count().desc(), UsageRecord.status)
    )
    return [(int(s), str(c or "-"), int(n), last) for s, c, n, last in (await session.execute(stmt)).all()]
