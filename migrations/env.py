"""Alembic environment: async engine (aiosqlite or asyncpg), URL handed in by `laneway migrate`."""

from __future__ import annotations

import asyncio

from alembic import context
from laneway.db import batch_tables, portal_tables  # noqa: F401  (their tables join Base.metadata)
from laneway.db.models import Base
from laneway.db.session import make_engine
from sqlalchemy.engine import Connection

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection, target_metadata=target_metadata, render_as_batch=connection.dialect.name == "sqlite"
    )  # SQLite ALTER via batch copy
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url, "sqlalchemy.url must be set (laneway migrate sets it from LANEWAY_DATABASE_URL)"
    engine = make_engine(url)
    async with engine.connect() as conn:
        await conn.run_sync(_run)
        await conn.commit()
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
    else:
        asyncio.run(_run_async())
