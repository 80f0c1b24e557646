"""External services the tests use (PostgreSQL, Redis): skip when absent, fail under CI=true."""

from __future__ import annotations

import os
import socket

import pytest

PG_URL = os.environ.get("LANEWAY_TEST_PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
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
    if IN_CI:
        pytest.fail(f"{message} (CI=true: services are required)")
    pytest.skip(f"{message}; start it to run these tests")
