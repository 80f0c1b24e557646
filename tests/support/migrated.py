"""Migrated, empty databases for the db_engine fixture without running Alembic for every test
(over a second a test on PostgreSQL on two busy cores, most of it Alembic's own Python). The
migrations run once per test process; the migrations themselves are tested by
tests/db/test_migrations_and_repositories.py, which downgrades and upgrades its own copy.

- SQLite: the once-migrated file is copied.
- PostgreSQL: a schema of the test's own (as before), into which the statements the one real
  migration sent to the server are replayed, in one transaction. Not a database copied from a
  template: PostgreSQL 15 checkpoints on every DROP DATABASE, stalling the other tests' queries.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from laneway.db import migrate
from laneway.db.session import make_engine
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from support.services import PG_URL


def pg_schema_engine(schema: str) -> AsyncEngine:
    return make_engine(PG_URL, connect_args={"server_settings": {"search_path": schema}})


async def admin_sql(*statements: str) -> None:
    engine = make_engine(PG_URL)
    try:
        async with engine.begin() as conn:
            for sql in statements:
                await conn.execute(text(sql))
    finally:
        await engine.dispose()


class MigratedTemplates:
    """This process's migrated templates, made on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._sqlite: Path | None = None
        self._pg_statements: list[tuple[str, Any]] | None = None

    async def sqlite_copy(self, dest: Path) -> str:
        """A migrated SQLite database at `dest`; its URL."""
        if self._sqlite is None:
            template = self.folder / "template.db"
            engine = make_engine(f"sqlite+aiosqlite:///{template}")
            try:
                await migrate.upgrade(engine)
            finally:
                await engine.dispose()  # the last connection out checkpoints the WAL into the file
            self._sqlite = template
        shutil.copyfile(self._sqlite, dest)
        return f"sqlite+aiosqlite:///{dest}"

    async def pg_schema(self) -> str:
        """A migrated schema of its own on the shared PostgreSQL; its name (give it back with
        `drop_pg_schema`)."""
        if self._pg_statements is None:
            self._pg_statements = await self._record_pg_migration()
        schema = f"lw_test_{uuid.uuid4().hex[:12]}"
        await admin_sql(f'CREATE SCHEMA "{schema}"')
        engine = pg_schema_engine(schema)
        try:
            async with engine.begin() as conn:
                for statement, parameters in self._pg_statements:
                    await conn.exec_driver_sql(statement, parameters)
        finally:
            await engine.dispose()
        return schema

    async def drop_pg_schema(self, schema: str) -> None:
        await admin_sql(f'DROP SCHEMA "{schema}" CASCADE')

    async def _record_pg_migration(self) -> list[tuple[str, Any]]:
        """Migrate a scratch schema with Alembic and keep what it changed: every statement but
        its reads (which only decide what to run next)."""
        schema = f"lw_template_{uuid.uuid4().hex[:12]}"
        await admin_sql(f'CREATE SCHEMA "{schema}"')
        engine = pg_schema_engine(schema)
        sent: list[tuple[str, Any]] = []

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
            # An executemany's parameters are a list of rows, which exec_driver_sql replays as one.
            if not statement.lstrip().upper().startswith("SELECT"):
                sent.append((statement, (list(parameters) if many else parameters) or None))

        try:
            await migrate.upgrade(engine)
        finally:
            await engine.dispose()
            await self.drop_pg_schema(schema)
        return sent
