"""Runs on SQLite and on PostgreSQL (skipped with a reason when PostgreSQL is absent)."""

from datetime import UTC, datetime, timedelta

from laneway.bootstrap import import_policies
from laneway.db import migrate
from laneway.db.repositories import ModelRepository, PolicyRepository, TenantRepository, UsageRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine

TABLES = {
    "tenants",
    "api_keys",
    "models",
    "deployments",
    "lanes",
    "task_policies",
    "usage_records",
    "admins",
    "admin_sessions",
    "audit_log",
    "files",
    "batches",
    "batch_items",
    "config_version",
    "usage_rollups",
    "portal_users",
    "portal_sessions",
    "portal_key_caps",
}


def not_a_partition(name: str | None, type_: str, parent_names: dict[str, str | None]) -> bool:
    """usage_records' day partitions (PostgreSQL, migration 0016) are laneway's to make, not the models'."""
    table = name if type_ == "table" else parent_names.get("table_name")
    return not (table or "").startswith("usage_records_p")


async def tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        names = set(await conn.run_sync(lambda c: inspect(c).get_table_names())) - {"alembic_version"}
    return {n for n in names if not_a_partition(n, "table", {})}


async def test_migrations_round_trip(db_engine: AsyncEngine) -> None:
    assert await tables(db_engine) == TABLES
    assert await migrate.current(db_engine) == "0019"
    await migrate.downgrade(db_engine, "base")
    assert await tables(db_engine) == set()
    assert await migrate.current(db_engine) is None
    await migrate.upgrade(db_engine)
    assert await tables(db_engine) == TABLES


async def test_tenant_keys_store_only_the_hash_and_revoke(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        repo = TenantRepository(s)
        tenant = await repo.create("acme", rpm=60, allowed_models=["tiny"])
        key = await repo.add_key(
            tenant, prefix="lw-abc1234", secret_sha256="f" * 64, expires_at=datetime.now(UTC) + timedelta(days=1)
        )
    async with sessions() as s, s.begin():
        repo = TenantRepository(s)
        found = await repo.find_key("f" * 64)
        assert found is not None and found.tenant.name == "acme" and found.tenant.allowed_models == ["tiny"]
        assert found.prefix == "lw-abc1234" and found.revoked_at is None
        assert await repo.revoke_key(key.id) is True
        assert await repo.revoke_key(key.id) is False  # already revoked
        await repo.touch_keys([key.id], datetime.now(UTC))
    async with sessions() as s:
        found = await TenantRepository(s).find_key("f" * 64)
        assert found is not None and found.revoked_at is not None and found.last_used_at is not None


async def test_model_alias_upsert_replaces_deployments(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await ModelRepository(s).upsert(
            "chat",
            deployments=[
                {
                    "name": "chat-a",
                    "engine_kind": "llamacpp",
                    "config": {"model_path": "/m.gguf"},
                    "quantization": "q4_k_m",
                    "gpu_type": "cpu",
                    "max_model_len": 4096,
                }
            ],
        )
    async with sessions() as s, s.begin():
        await ModelRepository(s).upsert(
            "chat", deployments=[{"name": "chat-b", "engine_kind": "sim", "config": {"max_concurrency": 4}}]
        )
    async with sessions() as s:
        specs = await ModelRepository(s).enabled_deployments()
    assert [(d.alias, d.name, d.engine_kind, d.config) for d in specs] == [
        ("chat", "chat-b", "sim", {"max_concurrency": 4})
    ]


async def test_policies_import_from_yaml_is_idempotent(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    first = await import_policies(sessions)
    assert first == await import_policies(sessions)
    async with sessions() as s:
        lanes = await PolicyRepository(s).lanes()
        tasks = {t.task: t for t in await PolicyRepository(s).task_policies()}
    assert [lane.name for lane in lanes] == ["batch", "interactive", "standard"]
    assert lanes[1].match_max_prompt_tokens == 511 and lanes[1].match_stream is True
    assert tasks["extract"].max_tokens == 96 and tasks["chat"].long_prompt_max_tokens == 256


async def test_usage_rows_insert_in_bulk(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    rows = [
        {
            "request_id": f"r{i}",
            "tenant_id": 7,
            "api_key_id": None,
            "model": "tiny",
            "endpoint": "chat",
            "stream": bool(i % 2),
            "status": 200,
            "prompt_tokens": 10,
            "completion_tokens": i,
            "created_at": datetime.now(UTC),
        }
        for i in range(50)
    ]
    async with sessions() as s, s.begin():
        await UsageRepository(s).add_many(rows)
    async with sessions() as s:
        stored = await UsageRepository(s).for_tenant(7)
    assert len(stored) == 50 and sum(r.completion_tokens for r in stored) == sum(range(50))


async def test_models_and_migrations_agree(db_engine: AsyncEngine) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from laneway.db import batch_tables, portal_tables  # noqa: F401  (their tables are on Base.metadata once imported)
    from laneway.db.models import Base

    async with db_engine.connect() as conn:
        diff = await conn.run_sync(
            lambda c: compare_metadata(
                MigrationContext.configure(c, opts={"include_name": not_a_partition}), Base.metadata
            )
        )
    assert diff == [], "models changed without a migration"
