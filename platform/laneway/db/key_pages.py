"""A tenant's API keys one page at a time, searched in the database: a tenant with 100,000 keys
is read 50 at a time on the (tenant_id) index, in id order, the cursor being the last id shown
(as the Files API's `after`)."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from laneway.db.models import ApiKey


async def key_page(
    session: AsyncSession, tenant_id: int, *, q: str = "", after: int | None = None, limit: int = 50
) -> list[ApiKey]:
    """Up to `limit` keys of the tenant with an id above `after`, whose name or prefix contains
    q (any case), by id. Ask for one more than a page to learn whether another follows."""
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    if q:
        pattern = q.lower()
        stmt = stmt.where(
            or_(
                ApiKey.name.icontains(pattern, autoescape=True),
                ApiKey.prefix.icontains(pattern, autoescape=True),
            )
        )
    if after is not None:
        stmt = stmt.where(ApiKey.id > after)
    return list((await session.execute(stmt.order_by(ApiKey.id).limit(limit))).scalars())
