"""Two `laneway serve` processes sharing Redis and PostgreSQL in front of one remote engine
(the vLLM protocol stand-in, which records the most requests it ever had in flight): together
they never give it more than its max_concurrency, and when one is killed with SIGKILL the
slots it held come back within the lease TTL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from standins.vllm_server import VLLMStandIn
from support import REDIS_URL, ServerThread, require_service, seed, serve

CAPACITY = 4


@pytest.fixture
def engine() -> Iterator[VLLMStandIn]:
    standin = VLLMStandIn(token_delay_s=0.01)
    server = ServerThread(standin.app).start(wait_ready=False)
    standin.base_url = server.base_url  # type: ignore[attr-defined]
    yield standin
    server.stop()


def test_two_replicas_share_one_engines_slots_and_a_dead_ones_come_back(
    pg_database: str, engine: VLLMStandIn, tmp_path: Path
) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    database = pg_database
    config = {
        "base_url": engine.base_url,
        "model": "m",
        "max_concurrency": CAPACITY,
        "metrics_poll_s": 0,  # type: ignore[attr-defined]
        "tokenize": False,
    }
    keys = asyncio.run(
        seed(
            database,
            models={"m": [{"name": "m-vllm", "engine_kind": "vllm", "max_model_len": 4096, "config": config}]},
            lanes=[
                {
                    "name": "standard",
                    "max_concurrency": CAPACITY,
                    "max_queue_depth": 500,
                    "queue_timeout_s": 30,
                    "max_unacked_tokens": 100_000,
                }
            ],
            tenants={"acme": {"max_concurrency": 1000}},
        )
    )
    env = {
        **os.environ,
        "LANEWAY_DATABASE_URL": database,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_REDIS_URL": REDIS_URL,
        "LANEWAY_REDIS_PREFIX": f"lwtest:{uuid.uuid4().hex}:",
        "LANEWAY_SLOT_LEASE_TTL_S": "1.0",
        "LANEWAY_DEFAULT_MAX_TOKENS": "100000",
    }
    (a, port_a), (b, port_b) = (
        serve({**env, "LANEWAY_DATA_DIR": str(tmp_path / "a")}),
        serve({**env, "LANEWAY_DATA_DIR": str(tmp_path / "b")}),
    )
    headers = {"Authorization": f"Bearer {keys['acme']}"}

    async def flood(ports: list[int], n: int, max_tokens: int) -> list[int]:
        async with httpx.AsyncClient(headers=headers, timeout=60, limits=httpx.Limits(max_connections=200)) as c:
            bodies = [{"model": "m", "prompt": "go", "max_tokens": max_tokens, "stream": i % 2 == 0} for i in range(n)]
            responses = await asyncio.gather(
                *(
                    c.post(f"http://127.0.0.1:{ports[i % len(ports)]}/v1/completions", json=body)
                    for i, body in enumerate(bodies)
                )
            )
            return [r.status_code for r in responses]

    try:
        # 10x the engine's capacity, half through each replica.
        assert asyncio.run(flood([port_a, port_b], 10 * CAPACITY, 20)) == [200] * (10 * CAPACITY)
        assert engine.max_running == CAPACITY  # used fully, never more

        # Replica A takes every slot with long streams, then dies without releasing them.
        streams = [
            httpx.stream(
                "POST",
                f"http://127.0.0.1:{port_a}/v1/completions",
                headers=headers,
                timeout=60,
                json={"model": "m", "prompt": "go", "max_tokens": 100_000, "stream": True},
            )
            for _ in range(CAPACITY)
        ]
        for s in streams:
            next(s.__enter__().iter_lines())
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        killed = time.monotonic()
        r = httpx.post(
            f"http://127.0.0.1:{port_b}/v1/completions",
            headers=headers,
            timeout=30,
            json={"model": "m", "prompt": "after", "max_tokens": 3},
        )
        waited = time.monotonic() - killed
        assert r.status_code == 200
        assert waited < 1.0 + 2.0, waited  # the lease TTL, plus a heartbeat and the request itself
        assert engine.max_running <= CAPACITY
        for s in streams:
            with contextlib.suppress(httpx.HTTPError):
                s.__exit__(None, None, None)
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
