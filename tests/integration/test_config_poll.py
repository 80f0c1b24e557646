"""A serving gateway on SQLite reads its configuration's version each poll and reloads only
when an edit moved it: an edit made outside it (the CLI, another process) still shows up live,
policies and engines alike, and an idle gateway reads no configuration table."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from laneway.db.repositories import ModelRepository, PolicyRepository
from laneway.db.session import make_engine, make_sessionmaker
from support import sim_model, start_gateway, wait_for


async def edit(url: str) -> None:
    """What `laneway lane set` and `laneway model set` do: write the rows, from another process's engine."""
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as s, s.begin():
            await PolicyRepository(s).upsert_lane("edited", position=0, max_concurrency=3)
            await ModelRepository(s).upsert("other", deployments=sim_model("other"))
    finally:
        await engine.dispose()


def test_an_edit_from_outside_is_reloaded_once_and_nothing_is_reloaded_while_idle(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path, seed_with={"models": {"chat": sim_model("chat")}}, policy_poll_interval_s=0.05)
    runtime = gw.server.runtime
    try:
        time.sleep(0.5)  # time passing is the point: ten polls, no reload
        assert runtime.config_poll.reloads == 0
        asyncio.run(edit(gw.database_url))
        wait_for(lambda: runtime.policies.current.lane("edited") is not None, within=10, what="the lane edit")
        wait_for(lambda: runtime.registry.aliases() == ["chat", "other"], within=10, what="the new alias")
        assert runtime.policies.current.lane("edited").max_concurrency == 3  # type: ignore[union-attr]
        time.sleep(0.5)  # time passing is the point: ten more polls, no second reload
        assert runtime.config_poll.reloads == 1
    finally:
        gw.stop()
