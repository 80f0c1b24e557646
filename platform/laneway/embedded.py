"""Run a laneway app under uvicorn on a loopback port in a background thread.

For benchmarks and tests that need the real HTTP server *and* access to the app's runtime
(engine slot counters, schedulers: `server.runtime`) from the same process.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import httpx
from litestar import Litestar

from laneway.runtime import runtime_of
from laneway.server import server_config
from laneway.server.uvicorn_fence import FencedServer, server_started, stop_server
from laneway.settings import Settings


class EmbeddedServer:
    def __init__(self, app: Litestar) -> None:
        self.app = app
        self.runtime = runtime_of(app)  # None for another ASGI app (a test's stand-in engine)
        # The production server configuration (protocol guards, limits), on a loopback port.
        settings = self.runtime.settings if self.runtime is not None else Settings()
        self.server = FencedServer(server_config(app, settings, log_level="warning", lifespan="on"))
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

    def start(self, timeout: float = 60, *, wait_ready: bool = True) -> EmbeddedServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server_started(self.server):
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
        """Run a coroutine on the server's loop (to touch the runtime safely) and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, *, drain: bool = True) -> None:
        """Stop like a SIGTERM would: drain the gateway (finish or cut what runs), then exit."""
        runtime = self.runtime
        if drain and runtime is not None and runtime.running and self.loop is not None and self._thread.is_alive():
            self.call(runtime.drain(), timeout=120)
        stop_server(self.server)
        self._thread.join(timeout=30)
