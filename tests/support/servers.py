"""The server factory: a seeded gateway served in-process (start_gateway) or as a `laneway serve`
subprocess (serve), and the Gateway handle the integration tests hold."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from laneway.app import create_app
from laneway.db.repositories import TenantRepository, UsageRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.embedded import EmbeddedServer as ServerThread
from laneway.settings import Settings

from support.ports import free_port
from support.seeding import seed

EXE = str(Path(sys.executable).with_name("laneway"))


@dataclass
class Gateway:
    server: ServerThread
    keys: dict[str, str]
    database_url: str
    settings: Settings = field(default_factory=Settings)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def api_url(self) -> str:
        return self.server.base_url + "/v1"

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def gateway(self) -> Any:
        """The running app's pipeline (laneway.core.pipeline.Gateway)."""
        return self.server.runtime.gateway

    def engine(self, alias: str):  # type: ignore[no-untyped-def]
        return self.gateway.registry.resolve(alias).engine

    def usage_rows(self, tenant_name: str | None = None) -> list[Any]:
        """Usage rows in the database (after flushing what the recorder holds)."""
        self.server.call(self.server.runtime.recorder.flush())

        async def read() -> list[Any]:
            engine = make_engine(self.database_url)
            try:
                async with make_sessionmaker(engine)() as s:
                    tenant_ids = None
                    if tenant_name is not None:
                        tenant = await TenantRepository(s).get_by_name(tenant_name)
                        tenant_ids = [tenant.id] if tenant else []
                    rows = []
                    for tid in tenant_ids if tenant_ids is not None else await _all_tenant_ids(s):
                        rows += await UsageRepository(s).for_tenant(tid)
                    return rows
            finally:
                await engine.dispose()

        return asyncio.run(read())

    def stop(self) -> None:
        self.server.stop()


async def _all_tenant_ids(session: Any) -> list[int]:
    from laneway.db.models import Tenant
    from sqlalchemy import select

    return list((await session.execute(select(Tenant.id))).scalars())


def in_process_settings(**fields: Any) -> Settings:
    """Settings for a gateway served in the tests' own process: no demo bootstrap, and the
    loop-delay load shedding off unless a test asks for it: the tests' clients share this
    process (and its GIL) with the gateway, so the loop delays they cause are the harness's,
    not the gateway's saturation (on a loaded machine they got a flood test's requests shed)."""
    return Settings(**{"bootstrap_demo": False, "shed_loop_delay_s": 0, **fields})


def start_gateway(
    data_dir: Path,
    *,
    database_url: str | None = None,
    wait_ready: bool = True,
    seed_with: dict[str, Any] | None = None,
    **settings: Any,
) -> Gateway:
    """Seed a database (SQLite in data_dir unless database_url is given) and serve it in-process
    on a loopback port. `settings` override Settings fields (in_process_settings' defaults)."""
    url = database_url or f"sqlite+aiosqlite:///{data_dir / 'laneway.db'}"
    keys = asyncio.run(seed(url, **(seed_with or {})))
    config = in_process_settings(data_dir=data_dir, database_url=url, **settings)
    server = ServerThread(create_app(config)).start(wait_ready=wait_ready)
    return Gateway(server=server, keys=keys, database_url=url, settings=config)


@contextmanager
def replica_pair(start_first: Callable[[], Gateway], start_second: Callable[[], Gateway]) -> Iterator[list[Gateway]]:
    """Two replicas of one deployment (the first seeds; the second shares its keys), both
    stopped at the end, and the first stopped too if the second fails to start."""
    a = start_first()
    try:
        b = start_second()
    except BaseException:
        a.stop()
        raise
    b.keys = a.keys
    try:
        yield [a, b]
    finally:
        a.stop()
        b.stop()


def serve(
    env: dict[str, str],
    *,
    log: Path | None = None,
    exe: str = EXE,
    cwd: Path | None = None,
    within: float = 60.0,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start `laneway serve` on a free port and wait for /health/ready (at most `within`
    seconds: its deployments' warm-up comes first); `log`: a file for its output (stdout and
    stderr) instead of this process's stderr; `exe`: another install's `laneway` (a wheel's),
    `cwd`: where it runs."""
    port = free_port()
    cmd, child_env = [exe, "serve"], {**env, "LANEWAY_PORT": str(port)}
    if log is None:
        proc = subprocess.Popen(cmd, env=child_env, cwd=cwd, stdout=subprocess.DEVNULL)
    else:
        with log.open("w") as sink:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, env=child_env, cwd=cwd, stdout=sink, stderr=sink)
    deadline = time.monotonic() + within
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("gateway did not become ready" + (f"; its log:\n{log.read_text()[-4000:]}" if log else ""))
        time.sleep(0.05)


def stop_all(*procs: subprocess.Popen[bytes], within: float = 30.0) -> None:
    """SIGTERM every gateway first (they drain side by side), then wait for each; one still
    running after `within` is killed, so a slow drain on a loaded machine neither leaves the
    others running nor hangs the suite. A test of the drain itself waits on its own terms."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + within
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def closed_by_server(socks: list[socket.socket], timeout: float = 5.0) -> int:
    """Close each socket; return how many the server had closed first (EOF, a reset, or a 408)."""
    closed = 0
    for s in socks:
        s.settimeout(timeout)
        try:
            data = s.recv(4096)
            closed += data == b"" or data.startswith(b"HTTP/1.1 408")
        except OSError:
            closed += 1
        s.close()
    return closed
