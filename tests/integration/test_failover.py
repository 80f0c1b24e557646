"""A replica that fails before the first byte costs the client nothing (issue 31): the request
goes to another replica of its alias, within a retry budget; a client's own 400 never moves;
a stream's status line waits for its first token, so a replica dying in prefill leaves no
empty 200 stream. Real processes on loopback; one is SIGKILLed mid-run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from laneway.embedded import EmbeddedServer
from standins.vllm_server import VLLMStandIn
from support import StandInProcess, start_gateway, start_stand_ins, until
from support import stand_in_deployment as deployment


def metric(gw: Any, name: str, **labels: str) -> float:
    text = httpx.get(gw.base_url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def three_replicas() -> Iterator[list[StandInProcess]]:
    replicas = start_stand_ins(3, token_delay_s=0.01)
    yield replicas
    for r in replicas:
        r.stop()


async def test_a_replica_killed_mid_run_fails_no_request_that_had_not_started(
    tmp_path: Path, three_replicas: list[StandInProcess]
) -> None:
    models = {"m": [deployment(f"m-{i}", r.base_url) for i, r in enumerate(three_replicas)]}
    gw = await asyncio.to_thread(
        start_gateway,
        tmp_path,
        seed_with={"models": models, "tenants": {"acme": {}}},
        usage_flush_interval_s=0.05,
        failover_max_tries=3,
        retry_budget_min=100,
    )
    try:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        victim = three_replicas[1]
        started_streams: list[int] = []

        async def whole(i: int) -> str:
            r = await client.completions.create(model="m", prompt=f"p{i}", max_tokens=30, seed=i)
            return r.choices[0].finish_reason

        async def streamed(i: int) -> str:
            stream = await client.completions.create(model="m", prompt=f"s{i}", max_tokens=30, seed=i, stream=True)
            finish, got = "", 0
            try:
                async for chunk in stream:
                    got += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
            except openai.APIError:
                assert got > 0, "a stream failed before its first byte"
                started_streams.append(i)
                return "cut after start"
            return finish

        async def kill_soon() -> None:
            await asyncio.sleep(0.15)  # time passing is the point: some requests queued, some mid-generation
            await asyncio.to_thread(victim.kill)

        tasks = [whole(i) for i in range(20)] + [streamed(i) for i in range(20)]
        results, _ = await asyncio.gather(asyncio.gather(*tasks), kill_soon())
        # A whole answer never failed: nothing had been sent before it completed.
        assert results[:20] == ["length"] * 20
        # A stream either completed or had already started on the victim when it died.
        assert all(r in ("length", "cut after start") for r in results[20:])
        # Requests sent after the kill are served by the survivors.
        after = await asyncio.gather(*(whole(100 + i) for i in range(6)))
        assert after == ["length"] * 6
        rows = await asyncio.to_thread(gw.usage_rows, "acme")
        assert len(rows) == 46
        moved = [r for r in rows if r.tries > 1]
        assert moved, "the kill happened while no request was on the victim"
        assert all(r.failed_deployments.startswith("m-1") and r.deployment != "m-1" and r.status == 200 for r in moved)
        assert metric(gw, "laneway_retries_total", alias="m") == len(moved)
        assert gw.gateway.in_flight == 0
    finally:
        await asyncio.to_thread(gw.stop)


@pytest.fixture
def pair() -> Iterator[tuple[VLLMStandIn, VLLMStandIn]]:
    first, second = VLLMStandIn(), VLLMStandIn()
    servers = []
    for standin in (first, second):
        server = EmbeddedServer(standin.app).start(wait_ready=False)
        standin.base_url = server.base_url
        servers.append(server)
    yield first, second
    for server in servers:
        server.stop()


def two_replica_gateway(tmp_path: Path, first: VLLMStandIn, second: VLLMStandIn, **settings: Any) -> Any:
    models = {
        "m": [deployment("m-a", first.base_url, **settings.pop("first_config", {})), deployment("m-b", second.base_url)]
    }
    seed_with = {"models": models, "tenants": {"acme": {}}}
    # Bound at arrival to the replica with the fewest requests, the first listed on a tie: these
    # tests send a request to the failing replica first on purpose (failover, not placement).
    settings.setdefault("routing", "least_outstanding")
    return start_gateway(tmp_path, seed_with=seed_with, usage_flush_interval_s=0.05, **settings)


async def test_a_replica_answering_500_is_failed_over_until_the_retry_budget_is_spent(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn]
) -> None:
    failing, healthy = pair
    # A budget of one retry: the first request moves, the next one the failing replica takes is refused.
    budget = {"retry_budget_min": 1, "retry_budget_ratio": 0.0, "policy_poll_interval_s": 60}
    gw = await asyncio.to_thread(two_replica_gateway, tmp_path, failing, healthy, **budget)
    failing.fail_generation = True  # once warm: a replica that starts failing
    try:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        first = await client.completions.create(model="m", prompt="one", max_tokens=3)
        assert first.choices[0].finish_reason == "length"
        with pytest.raises(openai.APIStatusError) as refused:
            await client.completions.create(model="m", prompt="two", max_tokens=3)
        assert refused.value.status_code == 503 and refused.value.response.headers.get("retry-after")
        assert metric(gw, "laneway_retries_total", alias="m", reason="engine_error") == 1
        assert metric(gw, "laneway_retry_budget_exhausted_total", alias="m") == 1
        rows = sorted(await asyncio.to_thread(gw.usage_rows, "acme"), key=lambda r: r.id)
        assert [(r.status, r.deployment, r.tries, r.failed_deployments) for r in rows] == [
            (200, "m-b", 2, "m-a"),
            (503, "m-a", 1, "m-a"),
        ]
    finally:
        await asyncio.to_thread(gw.stop)


async def test_the_clients_own_400_is_never_retried(tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn]) -> None:
    refusing, other = pair
    gw = await asyncio.to_thread(two_replica_gateway, tmp_path, refusing, other)
    refusing.fail_generation, refusing.fail_status = True, 400
    try:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        before = len(other.requests)
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="m", prompt="bad", max_tokens=3)
        assert len(other.requests) == before
        assert metric(gw, "laneway_retries_total") == 0
    finally:
        await asyncio.to_thread(gw.stop)


async def test_no_first_token_in_time_moves_a_stream_before_its_status_line(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn]
) -> None:
    slow, fast = pair
    slow.token_delay_s = 5.0
    gw = await asyncio.to_thread(two_replica_gateway, tmp_path, slow, fast, first_config={"first_token_timeout_s": 0.3})
    try:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        chunks = [c async for c in await client.completions.create(model="m", prompt="q", max_tokens=3, stream=True)]
        assert "".join(c.choices[0].text for c in chunks if c.choices).count(" ") == 3
        await until(lambda: slow.cancelled, what="the slow replica's request cancelled")
        [row] = await asyncio.to_thread(gw.usage_rows, "acme")
        assert (row.status, row.deployment, row.tries, row.failed_deployments) == (200, "m-b", 2, "m-a")
        assert metric(gw, "laneway_retries_total", alias="m", reason="first_token_timeout") == 1
    finally:
        await asyncio.to_thread(gw.stop)


async def test_a_stream_whose_every_replica_fails_before_a_token_gets_an_error_status_not_an_empty_200(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn]
) -> None:
    gw = await asyncio.to_thread(two_replica_gateway, tmp_path, *pair)
    for standin in pair:
        standin.fail_generation = True
    before = len(pair[0].requests) + len(pair[1].requests)  # their warm-ups
    try:
        async with httpx.AsyncClient(base_url=gw.api_url, headers={"Authorization": f"Bearer {gw.keys['acme']}"}) as c:
            r = await c.post("/completions", json={"model": "m", "prompt": "q", "max_tokens": 3, "stream": True})
        assert r.status_code == 503 and r.headers["content-type"].startswith("application/json")
        assert r.json()["error"]["code"] == "engine_error" and "retry-after" in r.headers
        assert len(pair[0].requests) + len(pair[1].requests) - before == 2  # one try each, then the failure
    finally:
        await asyncio.to_thread(gw.stop)


def set_fallbacks(database_url: str, alias: str, fallbacks: list[str]) -> None:
    """Write an alias's fallbacks as the admin service would (the gateway's poll picks them up)."""
    from laneway.db.repositories import ModelRepository
    from laneway.db.session import make_engine, make_sessionmaker

    async def write() -> None:
        engine = make_engine(database_url)
        try:
            async with make_sessionmaker(engine)() as s, s.begin():
                await ModelRepository(s).set_fallbacks(alias, fallbacks)
        finally:
            await engine.dispose()

    asyncio.run(write())


async def test_a_fallback_alias_serves_when_the_primary_has_no_healthy_replica(
    tmp_path: Path, pair: tuple[VLLMStandIn, VLLMStandIn]
) -> None:
    large, small = pair
    models = {
        "large": [deployment("large-1", large.base_url)],
        "small": [deployment("small-1", small.base_url)],
        "other": [deployment("other-1", small.base_url)],
    }
    seed_with = {"models": models, "tenants": {"acme": {}, "narrow": {"allowed_models": ["large"]}}}
    gw = await asyncio.to_thread(
        start_gateway, tmp_path, seed_with=seed_with, usage_flush_interval_s=0.05, policy_poll_interval_s=0.1
    )
    try:
        await asyncio.to_thread(set_fallbacks, gw.database_url, "large", ["small"])
        await until(lambda: gw.gateway.policies.current.fallbacks("large") == ("small",), what="the fallbacks loaded")
        large.healthy = False  # its health check fails: ejected from routing
        await until(lambda: not gw.gateway.registry.resolve("large").healthy, what="large-1 ejected")
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        raw = await client.completions.with_raw_response.create(model="large", prompt="q", max_tokens=3)
        answer = raw.parse()
        assert answer.model == "large" and raw.headers["x-laneway-served-model"] == "small"
        chunks = [
            c async for c in await client.completions.create(model="large", prompt="q", max_tokens=3, stream=True)
        ]
        assert {c.model for c in chunks} == {"large"}
        # A tenant that may not use the fallback is not served by it: its request goes to the primary.
        narrow = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["narrow"], max_retries=0)
        raw = await narrow.completions.with_raw_response.create(model="large", prompt="q", max_tokens=3)
        assert raw.headers["x-laneway-served-model"] == "large"
        rows = sorted(await asyncio.to_thread(gw.usage_rows, "acme"), key=lambda r: r.id)
        assert [(r.model, r.served_model, r.deployment, r.status) for r in rows] == [
            ("large", "small", "small-1", 200)
        ] * 2
    finally:
        await asyncio.to_thread(gw.stop)
