"""`laneway batch list` and `laneway batch cancel` end to end, in subprocesses, against a fresh
SQLite database whose batches the Batches API's store wrote: listed with tenant, status and
progress, filtered by tenant, paged; a cancel moves the batch to cancelling and is audited."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from laneway.db.batch_store import BatchStore
from laneway.db.repositories import AuditRepository, TenantRepository
from laneway.db.session import make_engine, make_sessionmaker
from support import EXE


def batches_of(url: str, tenant: str, *sizes: int) -> list[str]:
    """Batches of `tenant` with `sizes` requests each, the first of them answered."""

    async def go() -> list[str]:
        engine = make_engine(url)
        try:
            sessions = make_sessionmaker(engine)
            async with sessions() as s:
                found = await TenantRepository(s).get_by_name(tenant)
            assert found is not None
            store, ids = BatchStore(sessions), []
            for n in sizes:
                items = [(f"req-{i}", json.dumps({"model": "m", "messages": []})) for i in range(n)]
                batch = await store.create_batch(
                    found.id,
                    "k" * 64,
                    "/v1/chat/completions",
                    "file-in",
                    "24h",
                    None,
                    datetime.now(UTC) + timedelta(days=1),
                    items,
                )
                (item,) = await store.claim(batch.id, "replica-a", 1, 60)
                await store.finish(item.id, "replica-a", "succeeded", "{}")
                ids.append(batch.id)
            return ids
        finally:
            await engine.dispose()

    return asyncio.run(go())


def audit_of(url: str) -> list[tuple[str, str, str, str, object, object]]:
    async def go() -> list[tuple[str, str, str, str, object, object]]:
        engine = make_engine(url)
        try:
            async with make_sessionmaker(engine)() as s:
                rows = await AuditRepository(s).recent(100)
                return [(e.actor, e.action, e.entity, e.entity_id, e.before, e.after) for e in rows]
        finally:
            await engine.dispose()

    return asyncio.run(go())


def test_batch_list_and_cancel(tmp_path: Path) -> None:
    env = {**os.environ, "LANEWAY_DATA_DIR": str(tmp_path)}
    env.pop("LANEWAY_DATABASE_URL", None)
    url = f"sqlite+aiosqlite:///{(tmp_path / 'laneway.db').resolve()}"

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120, check=check)

    cli("tenant", "create", "acme")
    cli("tenant", "create", "other")
    assert cli("batch", "list").stdout == "no batches\n"
    older, newer = batches_of(url, "acme", 3, 2)
    (theirs,) = batches_of(url, "other", 4)

    lines = cli("batch", "list").stdout.splitlines()
    assert [line.split("\t")[:4] for line in lines] == [
        [theirs, "other", "in_progress", "1/4 done"],
        [newer, "acme", "in_progress", "1/2 done"],
        [older, "acme", "in_progress", "1/3 done"],
    ]
    assert lines[0].split("\t")[4] == "/v1/chat/completions" and "created 20" in lines[0]
    mine = cli("batch", "list", "--tenant", "acme", "--limit", "1")
    assert [line.split("\t")[0] for line in mine.stdout.splitlines()] == [newer]
    assert mine.stderr.strip().endswith(f"laneway batch list --after {newer}")
    rest = cli("batch", "list", "--tenant", "acme", "--after", newer).stdout
    assert [line.split("\t")[0] for line in rest.splitlines()] == [older]
    unknown = cli("batch", "list", "--tenant", "nobody", check=False)
    assert unknown.returncode == 1 and unknown.stderr == "laneway: No tenant named 'nobody'.\n"

    said = cli("batch", "cancel", theirs).stdout
    assert said.startswith(f"batch {theirs} of other is cancelling")
    assert cli("batch", "list", "--tenant", "other").stdout.split("\t")[2] == "cancelling"
    actor, *entry = audit_of(url)[0]
    assert actor.startswith("cli:")
    assert entry == ["cancel", "batch", theirs, {"status": "in_progress"}, {"status": "cancelling"}]
    missing = cli("batch", "cancel", "batch_nope", check=False)
    assert missing.returncode == 1 and missing.stderr == "laneway: No batch with id batch_nope.\n"
