"""Warm-up gates readiness: /health/ready is 503 until every deployment ran its warm-up
shapes, then 200; /health/live is 200 throughout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from support import start_gateway, wait_for

TOKEN = "warm-up-metrics-token"
DETAILS = {"Authorization": f"Bearer {TOKEN}"}  # /health/ready's details (names) need the metrics token


def _models(model: Path) -> dict[str, list[dict[str, Any]]]:
    slow = {"warmup_ms": 800, "warmup_system_prompts": ["You are terse.", "You answer in JSON."]}
    llama = {"model_path": str(model), "parallel": 1, "demo": True, "warmup_system_prompts": ["You are terse."]}
    return {
        "slow": [{"name": "slow-sim", "engine_kind": "sim", "max_model_len": 4096, "config": slow}],
        "llama": [{"name": "llama-1", "engine_kind": "llamacpp", "max_model_len": 2048, "config": llama}],
    }


def test_ready_only_after_every_deployment_is_warm(tmp_path: Path, demo_model_path: Path) -> None:
    server = start_gateway(
        tmp_path, seed_with={"models": _models(demo_model_path)}, wait_ready=False, metrics_token=TOKEN
    ).server
    try:
        seen: list[int] = []
        answers: list[httpx.Response] = []

        def ready_now() -> bool:
            assert httpx.get(server.base_url + "/health/live").status_code == 200
            ready = httpx.get(server.base_url + "/health/ready", headers=DETAILS)
            if ready.status_code == 503:
                assert ready.headers["retry-after"] == "1" and ready.json()["status"] == "not_ready"
            seen.append(ready.status_code)
            answers.append(ready)
            return ready.status_code == 200

        wait_for(ready_now, within=30, step=0.02, what="ready")
        ready = answers[-1]
        assert seen[0] == 503, "ready before the 800 ms warm-up finished"
        assert sorted(ready.json()["warm"]) == ["llama-1", "slow-sim"]
        registry = server.runtime.gateway.registry
        # short + long + one per system prompt
        assert registry.resolve("slow").engine.warmed_prompts == 4
        assert registry.resolve("llama").engine.warmed_prompts == 3
    finally:
        server.stop()
