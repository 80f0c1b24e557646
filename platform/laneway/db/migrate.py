"""Run Alembic migrations from code (the `laneway migrate` command and the tests)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine

from laneway.resources import MIGRATIONS, package_dir

MIGRATIONS_DIR = package_dir(MIGRATIONS)  # package data: found from any working directory


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    await _run(engine, lambda cfg: command.upgrade(cfg, revision))


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    await _run(engine, lambda cfg: command.downgrade(cfg, revision))


async def current(engine: AsyncEngine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())


async def _run(engine: AsyncEngine, action) -> None:  # type: ignore[no-untyped-def]
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    async with engine.begin() as conn:

        def go(sync_conn) -> None:  # type: ignore[no-untyped-def]
            cfg.attributes["connection"] = sync_conn
            action(cfg)

        await conn.run_sync(go)
