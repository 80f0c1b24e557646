"""Streaming safety through real sockets: backpressure against a slow reader, the engine slot
freed when a client hangs up (llama.cpp and sim), and the metrics that count both."""

from __future__ import annotations

import json
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from support import ServerThread, start_gateway, wait_for


def _seed_with(model: Path) -> dict[str, Any]:
    fast = {"max_concurrency": 4, "decode_ms_base": 0.2, "decode_ms_per_seq": 0.0}
    llama = {"model_path": str(model), "parallel": 2, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]}
    return {
        "models": {
            "fast": [{"name": "fast-sim", "engine_kind": "sim", "max_model_len": 1_000_000, "config": fast}],
            "llama": [
                {
                    "name": "llama-1",
                    "engine_kind": "llamacpp",
                    "max_model_len": 2048,
                    "quantization": "f32",
                    "gpu_type": "cpu",
                    "config": llama,
                }
            ],
        },
        "lanes": [
            {"name": "slow", "match_tasks": ["slow"], "max_unacked_tokens": 32},
            {"name": "standard", "max_unacked_tokens": 100_000},
        ],
        "tenants": {"acme": {}},
    }


class Env:
    def __init__(self, server: ServerThread, key: str) -> None:
        self.server, self.key = server, key

    def engine(self, alias: str) -> Any:
        return self.server.runtime.gateway.registry.resolve(alias).engine

    def raw_request(self, body: dict[str, Any], *, rcvbuf: int | None = None, task: str | None = None) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: sets the window
        sock.connect(("127.0.0.1", self.server.port))
        payload = json.dumps(body).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            + (f"X-Laneway-Task: {task}\r\n" if task else "")
            + "\r\n"
        )
        sock.sendall(head.encode() + payload)
        return sock

    def metrics(self) -> str:
        return httpx.get(self.server.base_url + "/metrics").text


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path) -> Iterator[Env]:
    # No task policy caps these requests: let them ask for long generations.
    gw = start_gateway(
        tmp_path_factory.mktemp("streaming"), seed_with=_seed_with(demo_model_path), default_max_tokens=1_000_000
    )
    yield Env(gw.server, gw.keys["acme"])
    gw.stop()


def test_a_slow_reader_gets_its_generation_cancelled_and_an_error_event(env: Env) -> None:
    sim = env.engine("fast")
    sock = env.raw_request(
        {"model": "fast", "prompt": "go", "max_tokens": 500_000, "stream": True}, rcvbuf=4096, task="slow"
    )
    received = b""
    try:
        wait_for(lambda: sim.active_slots == 1, step=0.0005)
        deadline = time.monotonic() + 30
        while sim.active_slots and time.monotonic() < deadline:  # read one token's worth a second
            received += sock.recv(64)
            time.sleep(1.0 if len(received) > 2048 else 0.01)
        assert sim.active_slots == 0, "the engine kept decoding for a client that does not read"
        sock.settimeout(10)
        while b'"code":"backpressure"' not in received:
            chunk = sock.recv(65536)
            assert chunk, received[-400:]
            received += chunk
    finally:
        sock.close()
    assert b"[DONE]" not in received
    assert 'reason="backpressure"' in env.metrics()


def test_a_fast_reader_is_never_cut_by_backpressure(env: Env) -> None:
    r = httpx.post(
        env.server.base_url + "/v1/completions",
        headers={"Authorization": f"Bearer {env.key}", "X-Laneway-Task": "slow"},
        json={"model": "fast", "prompt": "go", "max_tokens": 300, "stream": True},
    )
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert r.text.count('"text":" ') == 300


@pytest.mark.parametrize("alias", ["fast", "llama"])
@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_frees_the_engine_slot_within_50ms(env: Env, alias: str, stream: bool) -> None:
    engine = env.engine(alias)
    max_tokens = 1_000_000 if alias == "fast" else 2000
    times = []
    for _ in range(5):
        sock = env.raw_request({"model": alias, "prompt": "go", "max_tokens": max_tokens, "stream": stream})
        wait_for(lambda: engine.active_slots == 1, step=0.0005)
        if stream:
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        sock.close()
        times.append(wait_for(lambda: engine.active_slots == 0, within=5, step=0.0005))
    assert statistics.median(times) < 0.05, times
    assert 'reason="disconnect"' in env.metrics()


def test_metrics_expose_latency_tokens_and_queue_gauges_by_lane(env: Env) -> None:
    r = httpx.post(
        env.server.base_url + "/v1/completions",
        headers={"Authorization": f"Bearer {env.key}"},
        json={"model": "llama", "prompt": "hello", "max_tokens": 7},
    )
    assert r.status_code == 200
    text = env.metrics()
    labels = 'engine="llamacpp",gpu_type="cpu",lane="standard",model="llama",quantization="f32"'
    for name in (
        "laneway_time_to_first_token_seconds_count",
        "laneway_queue_wait_seconds_count",
        "laneway_prefill_seconds_count",
        "laneway_decode_seconds_count",
        "laneway_time_per_output_token_seconds_count",
        "laneway_request_duration_seconds_count",
    ):
        assert any(line.startswith(name) and labels in line for line in text.splitlines()), name
    assert any(
        line.startswith("laneway_completion_tokens_total{") and labels in line and float(line.split()[-1]) >= 7
        for line in text.splitlines()
    )
    assert 'laneway_requests_waiting{deployment="llama-1",engine="llamacpp"' in text
    assert 'laneway_requests_running{deployment="fast-sim"' in text
    assert 'status="200"' in text
