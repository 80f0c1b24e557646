"""Cancel on disconnect: how fast an abandoned stream frees its engine slot, and whether any leak.

For each engine (the tiny llama.cpp model and the sim), 200 times: a raw socket sends a
streaming completion, reads the response head and the first chunk, then resets the
connection (SO_LINGER 0: an abrupt disconnect). The bench polls the engine adapter's own
slot count until the slot is free. At the end it checks for leaks: engine slots, scheduler
slots and outstanding counts that did not return to zero.
Baseline: the same adapter's slot release when its stream is closed directly in-process
(aclose(), no HTTP) - the floor any gateway could reach.

Run: .venv/bin/python bench/streaming.py [--disconnects 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from laneway.app import create_app
from laneway.bootstrap import issue_key
from laneway.db import migrate
from laneway.db.repositories import ModelRepository, TenantRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.embedded import EmbeddedServer
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN, write_demo_model
from laneway.settings import Settings
from laneway.types import GenerationRequest

ENGINES = {
    "llamacpp": lambda model: {
        "engine_kind": "llamacpp",
        "max_model_len": 2048,
        "config": {"model_path": str(model), "parallel": 2, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]},
    },
    "sim": lambda model: {
        "engine_kind": "sim",
        "max_model_len": 1_000_000,
        "config": {"max_concurrency": 8, "decode_ms_base": 1.0},
    },
}


async def seed(url: str, model: Path) -> str:
    engine = make_engine(url)
    await migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    async with sessions() as s, s.begin():
        for kind, make in ENGINES.items():
            await ModelRepository(s).upsert(kind, deployments=[{"name": f"{kind}-1", **make(model)}])
        await TenantRepository(s).create("bench")
    _, key = await issue_key(sessions, "bench")
    await engine.dispose()
    return key


def wait_free(engine: Any, within: float = 5.0) -> float:
    start = time.perf_counter()
    while engine.active_slots:
        if time.perf_counter() - start > within:
            return float("inf")
        time.sleep(0.0002)
    return time.perf_counter() - start


def through_gateway(server: EmbeddedServer, key: str, alias: str, n: int) -> list[float]:
    engine = server.runtime.gateway.registry.resolve(alias).engine
    body = json.dumps({"model": alias, "prompt": "go", "max_tokens": 1900, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    times = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(head + body)
        got = b""
        while b"data: {" not in got:
            got += sock.recv(4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        sock.close()
        times.append(wait_free(engine))
    return times


def direct(server: EmbeddedServer, alias: str, n: int) -> list[float]:
    engine = server.runtime.gateway.registry.resolve(alias).engine

    async def once(i: int) -> float:
        stream = engine.generate(
            GenerationRequest(request_id=f"d{i}", prompt="go", prompt_tokens=2, max_tokens=1900, seed=i)
        )
        await anext(stream)
        await stream.aclose()
        return await asyncio.to_thread(wait_free, engine)

    async def all_of() -> list[float]:
        return [await once(i) for i in range(n)]

    return server.call(all_of(), timeout=600)  # on the server's loop, where the engine lives


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--disconnects", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        model = write_demo_model(data / "tiny.gguf")
        url = f"sqlite+aiosqlite:///{data / 'laneway.db'}"
        key = asyncio.run(seed(url, model))
        server = EmbeddedServer(
            create_app(Settings(data_dir=data, database_url=url, bootstrap_demo=False, default_max_tokens=100_000))
        ).start()
        rows = []
        try:
            for alias in ENGINES:
                base = direct(server, alias, args.disconnects)
                gw = through_gateway(server, key, alias, args.disconnects)
                time.sleep(0.5)  # let every finish() settle before counting leaks
                gateway = server.runtime.gateway
                deployment = gateway.registry.resolve(alias)
                leaked = (
                    deployment.engine.active_slots,
                    gateway.scheduler(deployment).running_total,
                    deployment.outstanding,
                )
                rows.append((alias, base, gw, leaked))
        finally:
            server.stop()
    print(
        f"\nlaneway cancel on disconnect: {platform.machine()} {os.cpu_count()} cores, python "
        f"{platform.python_version()}; {args.disconnects} abrupt disconnects (TCP RST after the first chunk) "
        "per engine; baseline = adapter stream closed in-process\n"
    )
    head = (
        f"| {'engine':<8} | {'direct p50':>10} | {'direct p99':>10} | {'disconnect p50':>14} | "
        f"{'disconnect p99':>14} | {'disconnect max':>14} | {'leaked engine/sched/outst.':>26} |"
    )
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for alias, base, gw, leaked in rows:
        print(
            f"| {alias:<8} | {pct(base, 0.5) * 1000:>8.2f}ms | {pct(base, 0.99) * 1000:>8.2f}ms | "
            f"{pct(gw, 0.5) * 1000:>12.2f}ms | {pct(gw, 0.99) * 1000:>12.2f}ms | {max(gw) * 1000:>12.2f}ms | "
            f"{'/'.join(map(str, leaked)):>26} |"
        )


if __name__ == "__main__":
    main()
