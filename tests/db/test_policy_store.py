from laneway.bootstrap import import_policies
from laneway.core.policy import PolicyStore
from laneway.core.routing import LaneRouter
from laneway.db.repositories import PolicyRepository
from laneway.db.session import make_sessionmaker
from sqlalchemy.ext.asyncio import AsyncEngine


async def test_reload_swaps_in_admin_edits_atomically(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    await import_policies(sessions)
    store = PolicyStore(sessions)
    before = await store.reload()
    assert [lane.name for lane in before.lanes] == ["batch", "interactive", "standard"]
    assert LaneRouter().route(before, prompt_tokens=600, stream=True, task=None).name == "standard"
    assert before.tasks["extract"].max_tokens == 96

    async with sessions() as s, s.begin():  # an admin widens the fast lane and tightens extract
        await PolicyRepository(s).upsert_lane("interactive", match_max_prompt_tokens=1023)
        await PolicyRepository(s).upsert_task("extract", max_tokens=64, stop=["###"])
    after = await store.reload()
    assert after is store.current and after is not before and after.version > before.version
    assert LaneRouter().route(after, prompt_tokens=600, stream=True, task=None).name == "interactive"
    assert after.tasks["extract"].max_tokens == 64 and after.tasks["extract"].stop == ("###",)
    # The old snapshot is untouched: a request that read it keeps a consistent view.
    assert before.tasks["extract"].max_tokens == 96
    assert await store.reload() is after  # nothing changed: no new snapshot
