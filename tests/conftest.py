"""Shared fixtures: the demo model, databases (SQLite always; PostgreSQL when reachable), services.

Under CI=true a missing PostgreSQL or Redis is a failure, not a skip.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from laneway.db import migrate
from laneway.db.session import make_engine
from laneway.engines.demo_model import write_demo_model
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from support.engine_kinds import engine_kind  # noqa: F401  (a fixture: any test may register a kind)
from support.services import PG_URL, PrivatePostgres, PrivateRedis, require_service, throwaway_database

# Hooks: each test marked by what it needs (markers), dealt out to xdist's workers (parallel), and
# the real vLLM launched early (vllm_early).
pytest_plugins = ["support.markers", "support.parallel", "support.vllm_early"]


@pytest.fixture(scope="session")
def demo_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(params=["sqlite", "postgres"])
async def db_engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated, empty database: SQLite in a temp file, or a throwaway PostgreSQL schema."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'test.db'}")
        await migrate.upgrade(engine)
        yield engine
        await engine.dispose()
        return
    require_service("PostgreSQL", "127.0.0.1", 5432)
    schema = f"lw_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_URL)
    async with admin.begin() as conn:
        await conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = make_engine(PG_URL, connect_args={"server_settings": {"search_path": schema}})
    try:
        await migrate.upgrade(engine)
        yield engine
    finally:
        await engine.dispose()
        async with admin.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        await admin.dispose()


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of this test's own, which it may stop and start."""
    base = Path(tempfile.mkdtemp(prefix="lw-pg-"))
    pg = PrivatePostgres(base)
    try:
        yield pg.start()
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A redis-server of this test's own, which it may kill, freeze and restart."""
    redis = PrivateRedis().start()
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A throwaway database on the shared PostgreSQL (for several processes to share)."""
    yield from throwaway_database()


@pytest.fixture(scope="module")
def pg_database_module() -> Iterator[str]:
    """pg_database for a module's servers (replicas started once for several tests)."""
    yield from throwaway_database()
