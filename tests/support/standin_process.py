"""The vLLM stand-in (tests/standins/vllm_process.py) as a process of its own on a loopback
port: a test can SIGKILL it, flip its switches and read the bodies it received."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from support.ports import free_port
from support.waiting import wait_for

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "vllm_process.py"


class StandInProcess:
    """The vLLM stand-in in a process of its own, so a test can SIGKILL it."""

    def __init__(self, token_delay_s: float = 0.002, *, wait: bool = True) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), str(self.port), str(token_delay_s)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait:
            self.wait_up()

    def wait_up(self) -> StandInProcess:
        wait_for(self._up, what=f"the stand-in on port {self.port}", within=30)
        return self

    def _up(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def control(self, **switches: Any) -> dict[str, Any]:
        """POST /_control: set its switches (fail_generation, fail_status, healthy); the answer
        (the switches and the count of requests received)."""
        answer: dict[str, Any] = httpx.post(self.base_url + "/_control", json=switches, timeout=5).json()
        return answer

    @property
    def received(self) -> int:
        return int(self.control()["requests"])

    def bodies(self) -> list[dict[str, Any]]:
        """Every request body it has received, in order (with "_path" and "_request_id")."""
        bodies: list[dict[str, Any]] = self.control(bodies=True)["bodies"]
        return bodies

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def start_stand_ins(count: int, token_delay_s: float = 0.002) -> list[StandInProcess]:
    """`count` stand-ins, started side by side (each spends its first second importing)."""
    started = [StandInProcess(token_delay_s, wait=False) for _ in range(count)]
    try:
        return [s.wait_up() for s in started]
    except BaseException:
        for s in started:
            s.stop()
        raise


def stand_in_deployment(name: str, base_url: str, **config: Any) -> dict[str, Any]:
    """A vllm-kind deployment of alias "m" on a stand-in (no shared slots unless asked)."""
    config = {"base_url": base_url, "model": "m", "metrics_poll_s": 0.05, "shared_slots": False, **config}
    return {"name": name, "engine_kind": "vllm", "max_model_len": 4096, "config": config}
