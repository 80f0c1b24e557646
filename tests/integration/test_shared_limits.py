"""Two gateway processes sharing Redis (and a database) enforce one rate limit, not two."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import httpx
from laneway.bootstrap import issue_key
from laneway.db import migrate
from laneway.db.repositories import ModelRepository, TenantRepository
from laneway.db.session import make_engine, make_sessionmaker
from services import require_service
from serving import serve, stop_all


async def _seed(url: str) -> str:
    engine = make_engine(url)
    await migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    async with sessions() as s, s.begin():
        await ModelRepository(s).upsert(
            "sim", deployments=[{"name": "sim-1", "engine_kind": "sim", "config": {"decode_ms_base": 0.5}}]
        )
        await TenantRepository(s).create("shared", rpm=4)
    _, key = await issue_key(sessions, "shared")
    await engine.dispose()
    return key


def test_two_gateways_on_one_redis_enforce_one_limit(tmp_path: Path) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    url = f"sqlite+aiosqlite:///{tmp_path / 'laneway.db'}"
    key = asyncio.run(_seed(url))
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(tmp_path),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_REDIS_URL": os.environ.get("LANEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "LANEWAY_REDIS_PREFIX": f"lwtest:{uuid.uuid4().hex}:",
    }
    (a, port_a), (b, port_b) = serve(env), serve(env)
    try:
        statuses = []
        for i in range(6):  # alternate between the two replicas
            port = port_a if i % 2 == 0 else port_b
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "sim", "prompt": "hi", "max_tokens": 2},
            )
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert statuses == [200, 200, 200, 200, 429, 429]
    finally:
        stop_all(a, b)
