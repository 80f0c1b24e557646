"""Traffic control through the real HTTP server and the OpenAI SDK, on the sim engine:
lanes, 429/503 with Retry-After, fairness under a flood, and a queued request whose client
leaves never reaching the engine."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from support import ServerThread, start_gateway, until

LANES: list[dict[str, Any]] = [
    {"name": "batch", "priority": 2, "match_tasks": ["batch"], "max_concurrency": 2},
    {
        "name": "narrow",
        "priority": 1,
        "match_tasks": ["narrow"],
        "max_concurrency": 1,
        "max_queue_depth": 1,
        "queue_timeout_s": 0.5,
        "retry_after_s": 7,
        "max_unacked_tokens": 10_000_000,
    },
    {"name": "fair", "priority": 1, "match_tasks": ["fair"], "max_concurrency": 1, "max_queue_depth": 500},
    # The hogs in these lanes are streams the tests do not read: no backpressure cut for them.
    {
        "name": "hold",
        "priority": 1,
        "match_tasks": ["hold"],
        "max_concurrency": 1,
        "queue_timeout_s": 30,
        "max_unacked_tokens": 10_000_000,
    },
    {"name": "interactive", "priority": 0, "match_max_prompt_tokens": 511, "match_stream": True},
    {"name": "standard", "priority": 1},
]
TENANTS: dict[str, dict[str, Any]] = {
    "acme": {"allowed_lanes": ["batch", "gone"]},  # may pick these lanes by name ("gone" does not exist)
    "limited": {"rpm": 2},
    "flood": {},
    "victim": {},
    "extract": {},
}


SIM = {"max_concurrency": 8, "decode_ms_base": 2.0, "prefill_ms_per_token": 0.001}
SEED: dict[str, Any] = {
    "models": {"sim": [{"name": "sim-1", "engine_kind": "sim", "max_model_len": 8192, "config": SIM}]},
    "lanes": LANES,
    "tasks": [{"task": "extract", "max_tokens": 96, "stop": []}],
    "tenants": TENANTS,
}


class Traffic:
    def __init__(self, server: ServerThread, keys: dict[str, str]) -> None:
        self.server, self.keys = server, keys

    def client(self, tenant: str = "acme", **headers: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.server.base_url + "/v1",
            api_key=self.keys[tenant],
            max_retries=0,
            default_headers=headers or None,
        )

    @property
    def gateway(self) -> Any:
        return self.server.runtime.gateway

    @property
    def sim(self) -> Any:
        return self.gateway.registry.resolve("sim").engine

    def depth(self, lane: str) -> int:
        return self.gateway.scheduler(self.gateway.registry.resolve("sim")).depth(lane)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traffic]:
    # Requests without a task policy may ask for long generations: a hog must outlast the test.
    gw = start_gateway(tmp_path_factory.mktemp("traffic"), seed_with=SEED, default_max_tokens=100_000)
    yield Traffic(gw.server, gw.keys)
    gw.stop()


MSG = [{"role": "user", "content": "hello there"}]


async def lane_of(client: openai.AsyncOpenAI, **kwargs: Any) -> str:
    raw = await client.chat.completions.with_raw_response.create(model="sim", max_tokens=2, **kwargs)
    parsed = raw.parse()
    if kwargs.get("stream"):
        async for _ in parsed:  # type: ignore[union-attr]
            pass

    return raw.headers["x-laneway-lane"]


async def test_short_streaming_prompts_take_the_interactive_lane(traffic: Traffic) -> None:
    c = traffic.client()
    assert await lane_of(c, messages=MSG, stream=True) == "interactive"
    long = [{"role": "user", "content": "word " * 600}]  # ~750 sim tokens
    assert await lane_of(c, messages=long, stream=True) == "standard"
    assert await lane_of(c, messages=MSG) == "standard"  # not streaming
    assert await lane_of(traffic.client(**{"X-Laneway-Task": "batch"}), messages=MSG, stream=True) == "batch"
    assert await lane_of(traffic.client(**{"X-Laneway-Lane": "batch"}), messages=MSG) == "batch"
    with pytest.raises(openai.BadRequestError):  # granted, but unknown
        await lane_of(traffic.client(**{"X-Laneway-Lane": "gone"}), messages=MSG)
    with pytest.raises(openai.PermissionDeniedError):  # not granted to this tenant
        await lane_of(traffic.client(**{"X-Laneway-Lane": "interactive"}), messages=MSG)


async def test_task_max_tokens_policy_applies(traffic: Traffic) -> None:
    r = await traffic.client("extract", **{"X-Laneway-Task": "extract"}).chat.completions.create(
        model="sim", messages=MSG, max_tokens=1000
    )
    assert r.usage is not None and r.usage.completion_tokens == 96  # the sim always uses its budget
    r = await traffic.client("extract", **{"X-Laneway-Task": "extract"}).chat.completions.create(
        model="sim", messages=MSG, max_tokens=5
    )
    assert r.usage is not None and r.usage.completion_tokens == 5


async def test_rate_limit_is_429_with_retry_after_in_openai_shape(traffic: Traffic) -> None:
    c = traffic.client("limited")
    for _ in range(2):
        await c.chat.completions.create(model="sim", messages=MSG, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as info:
        await c.chat.completions.create(model="sim", messages=MSG, max_tokens=2)
    err = info.value
    assert err.status_code == 429 and 1 <= int(err.response.headers["retry-after"]) <= 30
    assert err.body == {
        "message": err.body["message"],
        "type": "rate_limit_error",
        "param": None,  # type: ignore[index]
        "code": "rate_limit_exceeded",
    }


async def test_full_lane_and_queue_timeout_are_503_with_retry_after(traffic: Traffic) -> None:
    c = traffic.client(**{"X-Laneway-Task": "narrow"})
    for _ in range(3):  # the replica's latency model learns how long a request holds a slot here
        await c.chat.completions.create(model="sim", messages=MSG, max_tokens=2)
    hog = await c.chat.completions.create(model="sim", messages=MSG, max_tokens=5000, stream=True)
    await anext(aiter(hog))  # it holds the lane's only slot
    queued = asyncio.create_task(c.chat.completions.create(model="sim", messages=MSG, max_tokens=2))
    await until(lambda: traffic.depth("narrow") == 1)
    with pytest.raises(openai.InternalServerError) as full:
        await c.chat.completions.create(model="sim", messages=MSG, max_tokens=2)
    assert full.value.status_code == 503 and full.value.body["code"] == "queue_full"  # type: ignore[index]
    # Retry-After from the replica's latency model once it is warm (issue 38): a slot frees
    # every few ms here, so one slot's time, rounded up to 1 s; the lane's own retry_after_s
    # (7) is what it says while the model is cold.
    assert full.value.response.headers["retry-after"] == "1"
    with pytest.raises(openai.InternalServerError) as timeout:
        await queued
    assert timeout.value.body["code"] == "queue_timeout"  # type: ignore[index]
    assert timeout.value.response.headers["retry-after"] == "1"
    await hog.close()
    await until(lambda: traffic.sim.active_slots == 0)


async def test_a_flooding_tenant_does_not_starve_another(traffic: Traffic) -> None:
    flood = traffic.client("flood", **{"X-Laneway-Task": "fair"})
    victim = traffic.client("victim", **{"X-Laneway-Task": "fair"})
    done: list[str] = []

    async def one(client: openai.AsyncOpenAI, who: str) -> None:
        await client.chat.completions.create(model="sim", messages=MSG, max_tokens=8)
        done.append(who)

    floods = [asyncio.create_task(one(flood, "flood")) for _ in range(40)]
    await until(lambda: traffic.depth("fair") >= 30)
    victims = [asyncio.create_task(one(victim, "victim")) for _ in range(3)]
    await asyncio.gather(*floods, *victims)
    finished_victim = [i for i, who in enumerate(done) if who == "victim"]
    # FIFO would finish the victim last (positions 40-42); fair turns finish it within a few.
    assert max(finished_victim) < 25, done


async def test_a_queued_request_whose_client_leaves_never_reaches_the_engine(traffic: Traffic) -> None:
    c = traffic.client(**{"X-Laneway-Task": "hold"})
    hog = await c.chat.completions.create(model="sim", messages=MSG, max_tokens=5000, stream=True)
    await anext(aiter(hog))  # the role chunk: sent before the engine starts on it
    await until(lambda: traffic.sim.active_slots == 1)
    admitted = traffic.sim.admitted
    port = traffic.server.port
    body = b'{"model":"sim","messages":[{"role":"user","content":"never"}],"max_tokens":3}'
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {traffic.keys['acme']}"
        f"\r\nX-Laneway-Task: hold\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(request.encode() + body)
    await until(lambda: traffic.depth("hold") == 1)
    sock.close()  # the client leaves while queued
    await until(lambda: traffic.depth("hold") == 0)
    await hog.close()
    await until(lambda: traffic.sim.active_slots == 0)
    # The lane is free again: a new request runs, and it is the only one that reached the engine.
    r = await c.chat.completions.create(model="sim", messages=MSG, max_tokens=2)
    assert traffic.sim.admitted == admitted + 1
    assert traffic.sim.recent[-1] == r.id
