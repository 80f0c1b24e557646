"""The configuration's version (migration 0013): database triggers move it on every write to
models, deployments, lanes and task_policies, whoever writes; nothing else moves it. The
config poll (runtime/config_poll.py) reloads only when it moved. SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

from laneway.db import migrate
from laneway.db.config_version import config_version
from laneway.db.models import Deployment, Lane, TaskPolicy
from laneway.db.repositories import ModelRepository, PolicyRepository, TenantRepository, UsageRepository
from laneway.db.session import make_sessionmaker
from laneway.runtime.config_poll import ConfigPoll
from sqlalchemy import delete, text, update
from sqlalchemy.ext.asyncio import AsyncEngine
from support import sim_model


async def test_every_write_to_the_config_tables_moves_it_and_nothing_else_does(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    seen = [await config_version(db_engine)]

    async def moved() -> bool:
        now = await config_version(db_engine)
        moved, seen[0] = now != seen[0], now
        return moved

    async with sessions() as s, s.begin():
        await ModelRepository(s).upsert("chat", deployments=sim_model("chat"))  # models and deployments
    assert await moved()
    async with sessions() as s, s.begin():
        await s.execute(update(Deployment).values(draining=True))
    assert await moved()
    async with sessions() as s, s.begin():
        await ModelRepository(s).set_fallbacks("chat", [])
    assert await moved()
    async with sessions() as s, s.begin():
        await PolicyRepository(s).upsert_lane("fast", position=0)
    assert await moved()
    async with sessions() as s, s.begin():
        await s.execute(update(Lane).values(max_concurrency=2))
    assert await moved()
    async with sessions() as s, s.begin():
        await s.execute(delete(Lane))
    assert await moved()
    async with sessions() as s, s.begin():
        await PolicyRepository(s).upsert_task("extract", max_tokens=64)
    assert await moved()
    async with sessions() as s, s.begin():
        await s.execute(delete(TaskPolicy))
    assert await moved()
    async with sessions() as s, s.begin():
        await s.execute(delete(Deployment))
    assert await moved()

    # Tenants, keys (their last use) and usage rows are no configuration of the poll's.
    async with sessions() as s, s.begin():
        tenants = TenantRepository(s)
        tenant = await tenants.create("acme")
        key = await tenants.add_key(tenant, prefix="lw-x", secret_sha256="a" * 64)
        await tenants.touch_keys([key.id], datetime.now(UTC))
        await UsageRepository(s).add_many(
            [
                {
                    "request_id": "r1",
                    "tenant_id": tenant.id,
                    "model": "chat",
                    "endpoint": "chat",
                    "stream": False,
                    "status": 200,
                    "prompt_tokens": 1,
                    "completion_tokens": 1,
                    "created_at": datetime.now(UTC),
                }
            ]
        )
    assert not await moved()


async def test_a_write_that_rolls_back_leaves_it_where_it_was(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    before = await config_version(db_engine)
    async with sessions() as s:
        await PolicyRepository(s).upsert_lane("fast", position=0)
        await s.rollback()
    assert await config_version(db_engine) == before


async def test_the_poll_reloads_only_when_it_moved(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    applied: list[int] = []
    unsettled = [False]

    async def apply() -> None:
        applied.append(await config_version(db_engine))

    poll = ConfigPoll(
        lambda: config_version(db_engine), apply, seen=await config_version(db_engine), unsettled=lambda: unsettled[0]
    )
    for _ in range(3):
        assert await poll.refresh() is False
    assert applied == []
    async with sessions() as s, s.begin():  # an admin's edit (or another replica's, or the CLI's)
        await PolicyRepository(s).upsert_lane("fast", position=0)
    assert await poll.refresh() is True
    assert applied == [poll.seen] and poll.reloads == 1
    assert await poll.refresh() is False
    assert await poll.refresh(force=True) is True  # a NOTIFY: tenants and keys are not in the counter
    unsettled[0] = True  # a deployment that could not start: every poll retries it
    assert await poll.refresh() is True and await poll.refresh() is True
    assert len(applied) == 4


async def test_a_poll_that_knows_no_version_loads_once(db_engine: AsyncEngine) -> None:
    applied: list[None] = []

    async def apply() -> None:
        applied.append(None)

    poll = ConfigPoll(lambda: config_version(db_engine), apply)
    assert await poll.refresh() is True and await poll.refresh() is False
    assert applied == [None]


async def test_downgrading_removes_the_counter_and_its_triggers(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0012")
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():  # the tables it watched take writes without it
        # In SQL: the ORM's Lane has the columns of later migrations, which 0012 lacks.
        await s.execute(
            text(
                "INSERT INTO lanes (name, position, priority, max_queue_depth, queue_timeout_s, max_concurrency, "
                "max_unacked_tokens, retry_after_s, background) VALUES ('fast', 0, 0, 1, 1.0, 1, 1, 1, false)"
            )
        )
        await s.execute(text("DELETE FROM lanes"))
    await migrate.upgrade(db_engine)
    async with db_engine.connect() as conn:
        assert (await conn.execute(text("SELECT id, version FROM config_version"))).all() == [(1, 1)]
    before = await config_version(db_engine)
    async with sessions() as s, s.begin():
        await PolicyRepository(s).upsert_lane("fast", position=0)
    assert await config_version(db_engine) > before
