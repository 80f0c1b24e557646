"""Two gateway processes sharing Redis (and a database) enforce one rate limit, not two."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from pathlib import Path

import httpx
from support import REDIS_URL, require_service, seed, serve, stop_all, wait_for


async def _seed(url: str) -> dict[str, str]:
    """Two tenants: "shared" (4 requests a minute) and "roomy" (far from its limits)."""
    return await seed(
        url,
        models={"sim": [{"name": "sim-1", "engine_kind": "sim", "config": {"decode_ms_base": 0.5}}]},
        tenants={"shared": {"rpm": 4}, "roomy": {"rpm": 100_000, "tpm": 10_000_000, "max_concurrency": 1000}},
    )


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    return {
        **os.environ,
        "LANEWAY_DATA_DIR": str(tmp_path),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_REDIS_URL": REDIS_URL,
        "LANEWAY_REDIS_PREFIX": f"lwtest:{uuid.uuid4().hex}:",
    }


def test_two_gateways_on_one_redis_enforce_one_limit(tmp_path: Path) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    url = f"sqlite+aiosqlite:///{tmp_path / 'laneway.db'}"
    key = asyncio.run(_seed(url))["shared"]
    env = _env(tmp_path, url)
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


def test_far_from_its_limits_a_gateway_admits_at_once_and_redis_still_counts_it(tmp_path: Path) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    url = f"sqlite+aiosqlite:///{tmp_path / 'laneway.db'}"
    keys = asyncio.run(_seed(url))
    env = _env(tmp_path, url)
    proc, port = serve(env)
    try:
        used = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(20):
                r = client.post(
                    "/v1/completions",
                    headers={"Authorization": f"Bearer {keys['roomy']}"},
                    json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                )
                assert r.status_code == 200, r.text
                used += r.json()["usage"]["total_tokens"]
            decisions = _decisions(client.get("/metrics").text)
        assert decisions["replica"] >= 15 and decisions["redis"] >= 1  # the first, at least: nothing known yet
        # Redis counted every one of them, and the settles gave back what they did not use.
        pattern = f"{env['LANEWAY_REDIS_PREFIX']}rl:*:used:day:*"
        wait_for(lambda: asyncio.run(_counted(pattern)) == used, within=5, step=0.05, what=f"Redis counting {used}")
    finally:
        stop_all(proc)


def _decisions(metrics: str) -> dict[str, float]:
    found = re.findall(r'^laneway_ratelimit_decisions_total\{by="(\w+)"\} ([0-9.e+]+)$', metrics, re.M)
    return {by: float(n) for by, n in found}


async def _counted(pattern: str) -> int:
    import redis.asyncio as redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return sum([int(await client.get(k) or 0) for k in await client.keys(pattern)])
    finally:
        await client.aclose()
