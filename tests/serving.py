"""Run the real laneway app under uvicorn on a loopback port, in a background thread."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from litestar import Litestar

EXE = str(Path(sys.executable).with_name("laneway"))


class ServerThread:
    def __init__(self, app: Litestar) -> None:
        self.app = app
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
        )
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="laneway-test-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))

    def start(self, timeout: float = 60, *, wait_ready: bool = True) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the test server exited during start-up (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError("the test server did not start")
            time.sleep(0.01)
        while wait_ready and httpx.get(self.base_url + "/health/ready").status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("the test server did not become ready (warm-up)")
            time.sleep(0.01)
        return self

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop (to touch app state safely) and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


@dataclass
class Gateway:
    server: ServerThread
    keys: dict[str, str]
    database_url: str

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def api_url(self) -> str:
        return self.server.base_url + "/v1"

    def engine(self, alias: str):  # type: ignore[no-untyped-def]
        return self.server.app.state.gateway.registry.resolve(alias).engine


def serve(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start `laneway serve` on a free port and wait for /health/ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([EXE, "serve"], env={**env, "LANEWAY_PORT": str(port)}, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("gateway did not become ready")
        time.sleep(0.05)
