"""Test helpers: the embedded server, gateways in subprocesses, and the integration fixture type."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from laneway.embedded import EmbeddedServer as ServerThread

EXE = str(Path(sys.executable).with_name("laneway"))


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
