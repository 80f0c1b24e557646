"""Migration 0008 on SQLite and PostgreSQL: a task policy from before it keeps working with
the repetition stop off and the JSON stop on; the YAML defaults set the repetition rule; a
usage row stores the early stop that ended it."""

from laneway.bootstrap import import_policies
from laneway.core.policy import PolicyStore
from laneway.db import migrate
from laneway.db.repositories import PolicyRepository, UsageRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def test_a_task_policy_from_before_gets_repetition_off_and_json_stop_on(db_engine: AsyncEngine) -> None:
    await migrate.downgrade(db_engine, "0007")
    async with db_engine.begin() as conn:
        await conn.execute(text("INSERT INTO task_policies (task, max_tokens, stop) VALUES ('old', 64, '[]')"))
    await migrate.upgrade(db_engine)
    store = PolicyStore(make_sessionmaker(db_engine))
    old = (await store.reload()).tasks["old"]
    assert (old.repetition_ngram, old.repetition_count, old.json_stop) == (None, 3, True)


async def test_the_yaml_defaults_turn_the_repetition_stop_on(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    await import_policies(sessions)
    tasks = (await PolicyStore(sessions).reload()).tasks
    assert all(tasks[t].repetition_ngram and tasks[t].json_stop for t in ("chat", "extract", "reason", "batch"))
    async with sessions() as s, s.begin():
        await PolicyRepository(s).upsert_task("chat", repetition_ngram=None, json_stop=False)
    chat = (await PolicyStore(sessions).reload()).tasks["chat"]
    assert chat.repetition_ngram is None and chat.json_stop is False


async def test_a_usage_row_keeps_its_early_stop(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    row = {"request_id": "r", "tenant_id": 7, "model": "m", "endpoint": "chat", "status": 200}
    row["early_stop"] = "repetition"
    async with sessions() as s, s.begin():
        await UsageRepository(s).add_many([row, {**row, "request_id": "s", "early_stop": None}])
    async with sessions() as s:
        rows = await UsageRepository(s).for_tenant(7)
    assert sorted((r.request_id, r.early_stop) for r in rows) == [("r", "repetition"), ("s", None)]
