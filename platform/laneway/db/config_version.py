"""The configuration's version: one counter that database triggers move on every change to
models, deployments, lanes and task_policies (migration 0013). A replica polls it and reloads
only when it moved, where it used to read the four tables on every poll."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from laneway.db.models import ConfigVersion

SQL = f"SELECT version FROM {ConfigVersion.__tablename__} WHERE id = 1"


async def config_version(engine: AsyncEngine) -> int:
    """The counter now, read through the driver's own connection: polled by every replica on
    an idle gateway too, where an ORM session's bookkeeping (and on SQLite the async adapter's
    thread hop per cursor call) is most of a poll's cost."""
    async with engine.connect() as conn:
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if engine.dialect.name == "postgresql":
            return int(await driver.fetchval(SQL))
        rows = await driver.execute_fetchall(SQL)  # aiosqlite: one hop for execute, fetch and close
        return int(rows[0][0])
