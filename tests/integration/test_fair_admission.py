"""Fair admission over real sockets: tenant F keeps 100 short streams in flight on the
interactive lane; tenant B, one stream at a time, is admitted and served every time, and
the refusals go to F (before, B got 10 of 10 refused: admission looked at the lane's total)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from support import Gateway, sim_model, start_gateway, until

LANE = {
    "name": "interactive",
    "priority": 0,
    "match_max_prompt_tokens": 511,
    "match_stream": True,
    "max_concurrency": 4,
    "max_queue_depth": 64,
    "queue_timeout_s": 2.0,
    "max_unacked_tokens": 100_000,
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = start_gateway(
        tmp_path_factory.mktemp("fair"),
        seed_with={
            "models": {"sim": sim_model("sim", max_concurrency=4, decode_ms_base=2.0, decode_ms_per_seq=0.0)},
            "lanes": [LANE, {"name": "standard", "priority": 1}],
            "tenants": {"flood": {}, "b": {}},
        },
        default_max_tokens=100_000,
    )
    yield g
    g.stop()


async def stream_once(c: httpx.AsyncClient, max_tokens: int) -> tuple[int, str | None, float | None]:
    """(status, error code, time to the first token)."""
    started = time.perf_counter()
    body = {"model": "sim", "prompt": "hello", "max_tokens": max_tokens, "stream": True}
    async with c.stream("POST", "/completions", json=body) as r:
        if r.status_code != 200:
            return r.status_code, (await r.aread() and r.json()["error"]["code"]), None
        ttft = None
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: {") and '"text":" ' in line:
                ttft = time.perf_counter() - started
        return 200, None, ttft


async def test_a_tenant_with_one_request_is_served_while_another_floods(gw: Gateway) -> None:
    def client(tenant: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=gw.api_url,
            headers={"Authorization": f"Bearer {gw.keys[tenant]}"},
            timeout=30,
            limits=httpx.Limits(max_connections=200),
        )

    async with client("b") as b, client("flood") as f:
        unloaded = [await stream_once(b, 8) for _ in range(5)]
        assert all(s == 200 for s, _, _ in unloaded)
        stop = asyncio.Event()
        flood_outcomes: Counter[str] = Counter()

        async def flooder() -> None:
            while not stop.is_set():
                status, code, _ = await stream_once(f, 40)
                flood_outcomes[code or str(status)] += 1
                if status != 200:
                    await asyncio.sleep(0.01)

        flooders = [asyncio.create_task(flooder()) for _ in range(100)]
        # the flood fills the lane: refused beyond its share
        await until(lambda: sum(n for k, n in flood_outcomes.items() if k != "200"), what="the flood refused")
        during = [await stream_once(b, 8) for _ in range(10)]
        stop.set()
        await asyncio.gather(*flooders)
    assert [s for s, _, _ in during] == [200] * 10, during  # B: never refused
    refused = sum(n for k, n in flood_outcomes.items() if k != "200")
    assert refused > 0 and flood_outcomes["200"] > 0, flood_outcomes  # F: served its share, refused beyond
    assert set(flood_outcomes) <= {
        "200",
        "tenant_queue_share",
        "predicted_wait_exceeded",
        "queue_full",
        "queue_timeout",
    }, flood_outcomes
