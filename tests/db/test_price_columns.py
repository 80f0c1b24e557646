"""Migration 0010 on SQLite and PostgreSQL: an alias from before has no price (and its rows
no cost); a price set on the row is in the next policy snapshot, exactly, and removing it
takes it out; a usage row keeps its cost in micro-units beyond 2**31."""

from laneway.core.policy import PolicyStore
from laneway.core.prices import Price
from laneway.db import migrate
from laneway.db.repositories import ModelRepository, UsageRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def test_an_alias_from_before_is_not_priced_until_one_is_set(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0009")
    async with db_engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO models (alias, description, enabled, fallbacks, created_at) "
                "VALUES ('old', '', true, '[]', CURRENT_TIMESTAMP)"
            )
        )
    await migrate.upgrade(db_engine)
    sessions = make_sessionmaker(db_engine)
    store = PolicyStore(sessions)
    assert (await store.reload()).price("old") is None
    async with sessions() as s, s.begin():
        await ModelRepository(s).set_price("old", (150_000, 600_000, None))
    assert (await store.reload()).price("old") == Price(150_000, 600_000, None)
    async with sessions() as s, s.begin():
        await ModelRepository(s).set_price("old", (None, None, None))
    assert (await store.reload()).price("old") is None


async def test_a_usage_row_keeps_its_cost(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    row = {"request_id": "r", "tenant_id": 7, "model": "m", "endpoint": "chat", "status": 200}
    async with sessions() as s, s.begin():
        await UsageRepository(s).add_many([{**row, "cost_micros": 2**40 + 1}, {**row, "request_id": "s"}])
    async with sessions() as s:
        rows = await UsageRepository(s).for_tenant(7)
    assert sorted((r.request_id, r.cost_micros) for r in rows) == [("r", 2**40 + 1), ("s", None)]


def test_cost_is_rounded_half_up_from_the_exact_figure() -> None:
    price = Price(input=150_000, output=600_000, cached_input=75_000)
    assert price.cost(10, 10) == 8  # 7.5 micro-units
    assert price.cost(3, 0) == 0 and price.cost(4, 0) == 1  # 0.45, 0.6
    assert price.cost(100, 0, cached_tokens=100) == 8  # 7.5 at the cached price
    assert price.most(3, 1) == 2  # 1.05 rounded up: a budget never reserves less than the cost
