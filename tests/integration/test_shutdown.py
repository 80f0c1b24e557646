"""SIGTERM to a real `laneway serve` process with 20 streams in flight: it stops admitting
(503 + Retry-After, readiness 503), refuses what was queued the same way, lets running
streams finish within the drain timeout or ends them with an error event, exits cleanly,
and every request leaves its usage row, labelled with what really happened."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from laneway.db.repositories import UsageRepository
from laneway.db.session import make_engine, make_sessionmaker
from support import REDIS_URL, require_service, seed, serve, sim_model, wait_for


def stream(port: int, key: str, max_tokens: int, out: list[dict[str, Any]]) -> None:
    result: dict[str, Any] = {"status": None, "done": False, "error": None, "tokens": 0}
    try:
        body = {"model": "sim", "prompt": "go", "max_tokens": max_tokens, "stream": True}
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.stream(
            "POST", f"http://127.0.0.1:{port}/v1/completions", timeout=60, headers=headers, json=body
        ) as r:
            result["status"] = r.status_code
            result["retry_after"] = r.headers.get("retry-after")
            if r.status_code != 200:
                result["error"] = json.loads(r.read() or b"{}").get("error", {}).get("code")
                out.append(result)
                return
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    result["done"] = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        result["error"] = event["error"]["code"]
                    else:
                        result["tokens"] += 1
    except httpx.HTTPError as exc:
        result["error"] = f"transport: {exc}"
    out.append(result)


def usage_rows(url: str) -> list[Any]:
    async def read() -> list[Any]:
        engine = make_engine(url)
        async with make_sessionmaker(engine)() as s:
            rows = await UsageRepository(s).for_tenant(1)
        await engine.dispose()
        return rows

    return asyncio.run(read())


@pytest.mark.parametrize(
    ("limiter", "drain_s", "max_tokens"),
    [("redis", 20, 300), ("redis", 0.5, 100_000), ("memory", 0.5, 100_000)],
    ids=["finish-in-time-redis", "cut-after-drain-redis", "cut-after-drain-memory"],
)
def test_sigterm_drains_then_exits_and_every_request_keeps_its_row(
    tmp_path: Path, limiter: str, drain_s: float, max_tokens: int
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'laneway.db'}"
    keys = asyncio.run(
        seed(
            url,
            models={"sim": sim_model("sim", max_concurrency=8, decode_ms_base=5.0, decode_ms_per_seq=0.0)},
            lanes=[
                {
                    "name": "standard",
                    "max_concurrency": 8,
                    "max_queue_depth": 100,
                    "queue_timeout_s": 60,
                    "max_unacked_tokens": 1_000_000,
                }
            ],
            tenants={"acme": {"max_concurrency": 100}},
        )
    )
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(tmp_path),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_DRAIN_TIMEOUT_S": str(drain_s),
        "LANEWAY_DEFAULT_MAX_TOKENS": "1000000",
        "LANEWAY_USAGE_FLUSH_INTERVAL_S": "0.05",
    }
    if limiter == "redis":
        require_service("Redis", "127.0.0.1", 6379)
        env |= {"LANEWAY_REDIS_URL": REDIS_URL, "LANEWAY_REDIS_PREFIX": f"lwtest:{uuid.uuid4().hex}:"}
    proc, port = serve(env)
    results: list[dict[str, Any]] = []
    try:
        threads = [threading.Thread(target=stream, args=(port, keys["acme"], max_tokens, results)) for _ in range(20)]
        for t in threads:
            t.start()

        def running_and_queued() -> bool:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            return _gauge(text, "laneway_requests_running") == 8 and _gauge(text, "laneway_requests_waiting") == 12

        wait_for(running_and_queued, within=20, what="8 streams running and 12 queued")
        time.sleep(0.2)  # time passing is the point: every running stream has sent a few tokens
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: len(results) >= 12, within=10, what="the queued requests refused")
        ready = httpx.get(f"http://127.0.0.1:{port}/health/ready")
        late = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            headers={"Authorization": f"Bearer {keys['acme']}"},
            json={"model": "sim", "prompt": "late", "max_tokens": 2},
        )
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0  # a clean exit, not a signal death
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down" and late.headers["retry-after"]
    queued = [r for r in results if r["status"] == 503]
    streamed = [r for r in results if r["status"] == 200]
    assert len(queued) == 12 and all(r["error"] == "shutting_down" and r["retry_after"] for r in queued)
    assert len(streamed) == 8
    if drain_s >= 20:  # they had time: every stream finished in full
        assert all(r["done"] and r["tokens"] == max_tokens and r["error"] is None for r in streamed), streamed
    else:  # cut: an error event, not a silently truncated stream
        assert all(r["error"] == "shutting_down" and not r["done"] for r in streamed), streamed
    rows = usage_rows(url)
    assert len(rows) == 21  # 8 streams, 12 queued, 1 late
    by_status = sorted((r.status, r.error_code) for r in rows)
    expected_streams = (200, None) if drain_s >= 20 else (503, "shutting_down")
    assert by_status == sorted([expected_streams] * 8 + [(503, "shutting_down")] * 13)


def _gauge(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))
