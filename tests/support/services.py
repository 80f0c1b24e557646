"""External services the tests use (PostgreSQL, Redis): skip when absent, fail under CI=true."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from laneway.db.session import make_engine
from sqlalchemy import text

from support.ports import free_port
from support.waiting import wait_for

PG_URL = os.environ.get("LANEWAY_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("LANEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    message = f"{name} is not reachable at {host}:{port}"
    unavailable(f"{message}; start it to run these tests", f"{message} (CI=true: services are required)")


def unavailable(skip: str, fail: str) -> NoReturn:
    """Skip with `skip`, or under CI=true (where everything the suite needs is installed) fail
    with `fail`: a missing service, engine or tool must not pass CI as skipped tests."""
    if IN_CI:
        pytest.fail(fail)
    pytest.skip(skip)


def throwaway_database() -> Iterator[str]:
    """A database of its own on the shared PostgreSQL (its URL), dropped afterwards."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    name = f"lw_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin_sql(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        asyncio.run(_admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _admin_sql(sql: str) -> None:
    engine = make_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


# ---- private instances, for tests that stop, freeze or restart a service ----
# Never the machine's shared ones: each of these runs on its own free port and data directory.


def _wait_port(port: int, timeout: float = 15.0) -> None:
    wait_for(lambda: _reachable("127.0.0.1", port), within=timeout, step=0.02, what=f"something listening on {port}")


class PrivateRedis:
    """A redis-server of the test's own: kill, freeze (SIGSTOP), thaw and restart it."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            _missing("redis-server (to start a private Redis)")
        self.exe = str(exe)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port)
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.thaw()
        self.kill()


PG_BIN = Path("/usr/lib/postgresql")


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb + pg_ctl on a free port), to stop and
    start again. As root, the cluster runs as the `postgres` system user."""

    def __init__(self, base: Path) -> None:
        bins = sorted(PG_BIN.glob("*/bin/initdb"))
        if not bins:
            _missing("PostgreSQL's initdb (to start a private cluster)")
        self.bin = bins[-1].parent
        self.base = base
        self.data = base / "data"
        self.port = free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                _missing("runuser (to run a private PostgreSQL as the postgres user)")
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(base, "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as_user, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._run(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            )
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.base / "log"), "-w", "start"
        )
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")


def _missing(what: str) -> NoReturn:
    unavailable(f"{what} is not installed", f"{what} is not installed (CI=true: services are required)")
