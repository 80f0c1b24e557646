"""Warm-up gates readiness: /health/ready is 503 until every deployment ran its warm-up
shapes, then 200; /health/live is 200 throughout."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from laneway.app import create_app
from laneway.db import migrate
from laneway.db.repositories import ModelRepository
from laneway.db.session import make_engine, make_sessionmaker
from serving import ServerThread, in_process_settings


async def _seed(url: str, model: Path) -> None:
    engine = make_engine(url)
    await migrate.upgrade(engine)
    async with make_sessionmaker(engine)() as s, s.begin():
        await ModelRepository(s).upsert(
            "slow",
            deployments=[
                {
                    "name": "slow-sim",
                    "engine_kind": "sim",
                    "max_model_len": 4096,
                    "config": {"warmup_ms": 800, "warmup_system_prompts": ["You are terse.", "You answer in JSON."]},
                }
            ],
        )
        await ModelRepository(s).upsert(
            "llama",
            deployments=[
                {
                    "name": "llama-1",
                    "engine_kind": "llamacpp",
                    "max_model_len": 2048,
                    "config": {
                        "model_path": str(model),
                        "parallel": 1,
                        "demo": True,
                        "warmup_system_prompts": ["You are terse."],
                    },
                }
            ],
        )
    await engine.dispose()


def test_ready_only_after_every_deployment_is_warm(tmp_path: Path, demo_model_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'laneway.db'}"
    asyncio.run(_seed(url, demo_model_path))
    server = ServerThread(create_app(in_process_settings(data_dir=tmp_path, database_url=url)))
    server.start(wait_ready=False)
    try:
        seen = []
        deadline = time.monotonic() + 30
        while not seen or seen[-1] != 200:
            assert time.monotonic() < deadline, "never became ready"
            assert httpx.get(server.base_url + "/health/live").status_code == 200
            ready = httpx.get(server.base_url + "/health/ready")
            if ready.status_code == 503:
                assert ready.headers["retry-after"] == "1" and ready.json()["status"] == "not_ready"
            seen.append(ready.status_code)
            time.sleep(0.02)
        assert seen[0] == 503, "ready before the 800 ms warm-up finished"
        assert sorted(ready.json()["warm"]) == ["llama-1", "slow-sim"]
        registry = server.runtime.gateway.registry
        # short + long + one per system prompt
        assert registry.resolve("slow").engine.warmed_prompts == 4
        assert registry.resolve("llama").engine.warmed_prompts == 3
    finally:
        server.stop()
