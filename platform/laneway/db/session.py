"""Async engine and session factory for SQLite (aiosqlite) or PostgreSQL (asyncpg)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine


def make_engine(
    url: str, *, connect_timeout_s: float | None = None, command_timeout_s: float | None = None, **kwargs: Any
) -> AsyncEngine:
    """An engine for `url`. The timeouts matter for PostgreSQL: without them a database that is
    down or frozen makes every caller wait for the OS (minutes), not for a second or two."""
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # readers never block the usage writer
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", {}))
    if connect_timeout_s is not None:
        connect_args.setdefault("timeout", connect_timeout_s)
        kwargs.setdefault("pool_timeout", connect_timeout_s)
    if command_timeout_s is not None:
        connect_args.setdefault("command_timeout", command_timeout_s)
    return create_async_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
