"""An API key's last_used_at is written at most once a minute (per replica), not with every
batch of usage rows that names it."""

from __future__ import annotations

from datetime import datetime

from laneway.bootstrap import issue_key
from laneway.core.auth import hash_secret
from laneway.db.repositories import TenantRepository
from laneway.db.session import make_sessionmaker
from laneway.usage import UsageRecorder
from laneway.usage.recorder import KEY_TOUCH_EVERY_S
from sqlalchemy.ext.asyncio import AsyncEngine
from support.usage import usage_record


async def test_a_key_used_twice_within_a_minute_is_touched_once(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await TenantRepository(s).create("acme")
    key_id, secret = await issue_key(sessions, "acme")
    other_id, other = await issue_key(sessions, "acme", name="other")
    now = [1000.0]
    recorder = UsageRecorder(sessions, interval_s=60, clock=lambda: now[0])

    async def last_used(digest: str) -> datetime | None:
        async with sessions() as s:
            key = await TenantRepository(s).find_key(digest)
            assert key is not None
            return key.last_used_at

    recorder.record(usage_record(0, key_id))
    assert await recorder.flush()
    first = await last_used(hash_secret(secret))
    assert first is not None

    now[0] += KEY_TOUCH_EVERY_S - 1  # within the minute: the rows are written, the key not touched
    recorder.record(usage_record(1, key_id))
    recorder.record(usage_record(2, other_id))  # a key not touched yet is, at once
    assert await recorder.flush()
    assert await last_used(hash_secret(secret)) == first
    assert await last_used(hash_secret(other)) is not None

    now[0] += 1  # a minute after the first touch
    recorder.record(usage_record(3, key_id))
    assert await recorder.flush()
    later = await last_used(hash_secret(secret))
    assert later is not None and later > first
    assert recorder.written == 4
