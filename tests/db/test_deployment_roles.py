"""Migration 0018 on SQLite and PostgreSQL: a deployment keeps its role, weight and sample; a row
from before serves (role "serving", 0 and 0); a role change moves config_version (every
replica reloads it) as any other edit of the deployments does."""

from laneway.db import migrate
from laneway.db.config_version import config_version
from laneway.db.repositories import ModelRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def test_a_deployment_from_before_serves(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0017")
    async with db_engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO models (alias, description, enabled, created_at) VALUES ('m', '', true, CURRENT_TIMESTAMP)"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO deployments (model_id, name, engine_kind, config, quantization, gpu_type, max_model_len, "
                "enabled, draining) SELECT id, 'm-a', 'sim', '{}', 'q', 'g', 2048, true, false FROM models"
            )
        )
    await migrate.upgrade(db_engine)
    async with db_engine.connect() as conn:
        row = (await conn.execute(text("SELECT role, weight, sample FROM deployments"))).one()
    assert tuple(row) == ("serving", 0.0, 0.0)


async def test_roles_are_kept_and_a_change_moves_the_config_version(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    deployment = {"engine_kind": "sim", "config": {}, "quantization": "q", "gpu_type": "g", "max_model_len": 2048}
    async with sessions() as s, s.begin():
        await ModelRepository(s).upsert(
            "m",
            deployments=[
                {**deployment, "name": "m-a"},
                {**deployment, "name": "m-b", "role": "canary", "weight": 12.5},
                {**deployment, "name": "m-c", "role": "shadow", "sample": 25.0},
            ],
        )
    before = await config_version(db_engine)
    async with sessions() as s:
        specs = await ModelRepository(s).enabled_deployments()
    assert [(d.name, d.role, d.weight, d.sample) for d in specs] == [
        ("m-a", "serving", 0.0, 0.0),
        ("m-b", "canary", 12.5, 0.0),
        ("m-c", "shadow", 0.0, 25.0),
    ]
    async with db_engine.begin() as conn:
        await conn.execute(text("UPDATE deployments SET weight = 0 WHERE name = 'm-b'"))
    assert await config_version(db_engine) > before
