"""Shared fixtures: the demo model, databases (SQLite always; PostgreSQL when reachable), services.

Under CI=true a missing PostgreSQL or Redis is a failure, not a skip.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from laneway.db.session import make_engine
from laneway.engines.demo_model import write_demo_model
from sqlalchemy.ext.asyncio import AsyncEngine
from support.engine_kinds import engine_kind  # noqa: F401  (a fixture: any test may register a kind)
from support.engines_real import smollm2_path
from support.migrated import MigratedTemplates, pg_schema_engine
from support.services import PrivatePostgres, PrivateRedis, require_service, throwaway_database

# Hooks: each test marked by what it needs (markers), dealt out to xdist's workers (parallel), and
# the real vLLM launched early (vllm_early).
pytest_plugins = ["support.markers", "support.parallel", "support.vllm_early", "support.teardown", "pytester"]


@pytest.fixture(scope="session")
def demo_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="session")
def smollm2_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 on llama.cpp, the README's demo model (a real engine: support/markers.py)."""
    return smollm2_path(tmp_path_factory)


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory: pytest.TempPathFactory) -> MigratedTemplates:
    return MigratedTemplates(tmp_path_factory.mktemp("migrated"))


@pytest.fixture(params=["sqlite", "postgres"])
async def db_engine(
    request: pytest.FixtureRequest, tmp_path: Path, migrated_templates: MigratedTemplates
) -> AsyncIterator[AsyncEngine]:
    """A migrated, empty database of this test's own: SQLite in a temp file, or a throwaway
    PostgreSQL schema; migrated once a process and copied (tests/support/migrated.py)."""
    if request.param == "sqlite":
        engine = make_engine(await migrated_templates.sqlite_copy(tmp_path / "test.db"))
        yield engine
        await engine.dispose()
        return
    require_service("PostgreSQL", "127.0.0.1", 5432)
    schema = await migrated_templates.pg_schema()
    engine = pg_schema_engine(schema)
    try:
        yield engine
    finally:
        await engine.dispose()
        await migrated_templates.drop_pg_schema(schema)


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
