"""Clients that leave at the wrong moment, over real sockets: abrupt resets (TCP RST) at every
stage of a request, and client time-outs under 5x overload. Afterwards nothing is held (no
engine slot, queue entry, outstanding count, rate-limit holder) and every request that got a
lease left exactly one usage row. With the memory limiter and with real Redis."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import REDIS_URL, Gateway, require_service, sim_model, start_gateway, wait_for

LANES = [
    {
        "name": "interactive",
        "priority": 0,
        "match_max_prompt_tokens": 511,
        "match_stream": True,
        "max_concurrency": 4,
        "max_queue_depth": 200,
        "queue_timeout_s": 5.0,
        "max_unacked_tokens": 100_000,
    },
    {"name": "standard", "priority": 1, "max_concurrency": 4, "max_queue_depth": 200, "queue_timeout_s": 5.0},
]


@pytest.fixture(scope="module", params=["memory", "redis"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    extra: dict[str, Any] = {}
    if request.param == "redis":
        require_service("Redis", "127.0.0.1", 6379)
        extra = {"redis_url": REDIS_URL, "redis_prefix": f"lwtest:{uuid.uuid4().hex}:"}
    g = start_gateway(
        tmp_path_factory.mktemp(f"disconnects-{request.param}"),
        seed_with={
            "models": {"sim": sim_model("sim", max_concurrency=4, decode_ms_base=0.5, decode_ms_per_seq=0.0)},
            "lanes": LANES,
            "tenants": {"acme": {"max_concurrency": 10_000}},
        },
        default_max_tokens=100_000,
        usage_flush_interval_s=0.05,
        **extra,
    )
    yield g
    g.stop()


def raw(gw: Gateway, body: dict[str, Any], *, send_body: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.keys['acme']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock.sendall(head + payload if send_body else head)
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float = 10) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while marker not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def limiter_holders(gw: Gateway) -> int:
    limiter = gw.gateway.limiter
    tenant_id = 1
    if hasattr(limiter, "fallback"):  # Redis: the tenant's in-flight set, once settles have landed
        assert gw.server.call(limiter.settled())

        async def count() -> int:
            return int(await limiter._redis.zcard(limiter._keys(tenant_id)[2]))

        return gw.server.call(count()) + limiter.fallback.in_flight(tenant_id)
    return int(limiter.in_flight(tenant_id))


def assert_settled_without_leaks(gw: Gateway) -> None:
    pipeline = gw.gateway
    wait_for(lambda: pipeline.in_flight == 0, within=30, what="every lease released")
    [deployment] = pipeline.registry.deployments()
    scheduler = pipeline.scheduler(deployment)
    assert (scheduler.running_total, scheduler.waiting_total, deployment.outstanding) == (0, 0, 0)
    wait_for(lambda: deployment.engine.active_slots == 0, what="the engine idle")
    assert limiter_holders(gw) == 0
    rows = gw.usage_rows("acme")
    assert len(rows) == pipeline.leases_opened, "a request with a lease left no usage row (or two)"
    assert len({r.request_id for r in rows}) == len(rows)
    # And the deployment serves again, at full capacity.
    r = httpx.post(
        gw.api_url + "/completions",
        headers={"Authorization": f"Bearer {gw.keys['acme']}"},
        json={"model": "sim", "prompt": "hi", "max_tokens": 3},
        timeout=10,
    )
    assert r.status_code == 200


def test_resets_at_every_stage_of_a_request_leak_nothing(gw: Gateway) -> None:
    rng = random.Random(7)
    stream_body = {"model": "sim", "prompt": "go", "max_tokens": 400, "stream": True}
    plain_body = {"model": "sim", "prompt": "go", "max_tokens": 60}
    # Hogs keep every slot busy part of the time, so some resets land while queued.
    hogs = [raw(gw, stream_body) for _ in range(4)]

    def stage(i: int) -> None:
        point = i % 6
        if point == 0:  # headers sent, body never
            raw(gw, plain_body, send_body=False).close()
        elif point == 1:  # the whole request, then at once
            raw(gw, stream_body if i % 2 else plain_body).close()
        elif point == 2:  # once the stream's headers arrived (the slot was just granted)
            sock = raw(gw, stream_body)
            read_until(sock, b"\r\n\r\n")
            sock.close()
        elif point == 3:  # after the first chunk
            sock = raw(gw, stream_body)
            read_until(sock, b"data: ")
            sock.close()
        elif point == 4:  # a non-streaming answer being generated (or still queued)
            sock = raw(gw, plain_body)
            time.sleep(rng.uniform(0, 0.02))
            sock.close()
        else:  # a stream in the middle, at a random moment
            sock = raw(gw, stream_body)
            time.sleep(rng.uniform(0, 0.05))
            sock.close()

    threads = [threading.Thread(target=lambda n=n: [stage(n * 20 + j) for j in range(20)]) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for hog in hogs:
        hog.close()
    assert_settled_without_leaks(gw)
    statuses = {r.status for r in gw.usage_rows("acme")}
    assert 499 in statuses and 500 not in statuses


async def test_client_time_outs_at_5x_capacity_leak_nothing(gw: Gateway) -> None:
    """20 clients against 4 slots, each giving up after 20-300 ms, for 2 seconds."""
    rng = random.Random(11)
    results: list[str] = []

    async def client(n: int) -> None:
        async with httpx.AsyncClient(base_url=gw.api_url, headers={"Authorization": f"Bearer {gw.keys['acme']}"}) as c:
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                body = {"model": "sim", "prompt": "go", "max_tokens": rng.randint(20, 200), "stream": n % 2 == 0}
                try:
                    r = await c.post("/completions", json=body, timeout=rng.uniform(0.02, 0.3))
                    results.append(str(r.status_code))
                except httpx.TimeoutException:
                    results.append("timeout")

    await asyncio.gather(*(client(n) for n in range(20)))
    assert "timeout" in results and "500" not in results
    await asyncio.to_thread(assert_settled_without_leaks, gw)


def test_a_usage_row_per_lease_names_its_lane_and_path(gw: Gateway, tmp_path: Path) -> None:
    rows = gw.usage_rows("acme")
    assert rows and all(r.lane in {"interactive", "standard"} and r.endpoint == "completions" for r in rows)
