"""Migration 0015 on SQLite and PostgreSQL: a usage row keeps its continuations and the prompt
tokens they prefilled (laneway's cost); a row from before reads 0 and 0."""

from laneway.db import migrate
from laneway.db.repositories import UsageRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def test_a_row_from_before_reads_no_continuations(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0014")
    async with db_engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO usage_records (request_id, created_at, model, endpoint, stream, status, prompt_tokens, "
                "completion_tokens, tries) VALUES ('old', CURRENT_TIMESTAMP, 'm', 'chat', false, 200, 3, 4, 1)"
            )
        )
    await migrate.upgrade(db_engine)
    async with db_engine.connect() as conn:
        row = (await conn.execute(text("SELECT continuations, continued_prompt_tokens FROM usage_records"))).one()
    assert tuple(row) == (0, 0)


async def test_a_usage_row_keeps_its_continuations(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    row = {"request_id": "r", "tenant_id": 7, "model": "m", "endpoint": "chat", "status": 200}
    async with sessions() as s, s.begin():
        await UsageRepository(s).add_many(
            [{**row, "continuations": 1, "continued_prompt_tokens": 41}, {**row, "request_id": "s"}]
        )
    async with sessions() as s:
        rows = await UsageRepository(s).for_tenant(7)
    assert sorted((r.request_id, r.continuations, r.continued_prompt_tokens) for r in rows) == [
        ("r", 1, 41),
        ("s", 0, 0),
    ]
