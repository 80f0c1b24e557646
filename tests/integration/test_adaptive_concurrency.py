"""A replica's running limit is learned through the gateway (core/latency/limit.py): a sim
engine whose step time grows steeply with the sequences it runs (10 ms + 30 ms each: 250 ms a
token at its 8 sequences) serves a lane whose TPOT target is 110 ms. Eight clients keep eight
requests in flight; laneway backs the replica's limit off below the engine's 8, where the
target can hold, and /metrics and the admin's models page say so. (The unit tests hold the
algorithm to the exact limit on an exact clock; here the sim's sleeps stretch with a loaded
machine, so this proves the wiring: the limit moves and laneway's running count follows.)"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
from support import sim_model, start_gateway

PASSWORD = "correct horse battery"
SIM = {"max_concurrency": 8, "decode_ms_base": 10.0, "decode_ms_per_seq": 30.0, "prefill_ms_per_token": 0.0}
LANES = [
    {
        "name": "standard",
        "priority": 0,
        "max_concurrency": 8,
        "max_queue_depth": 100,
        "queue_timeout_s": 60,
        "tpot_target_ms": 110,
    }
]


def reading(metrics: str, name: str, *parts: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(p in line for p in parts):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {parts} not in /metrics")


def test_a_replica_that_slows_with_load_is_backed_off_below_its_engines_limit(tmp_path: Path) -> None:
    seed = {"models": {"sim": sim_model("sim", **SIM)}, "lanes": LANES, "tenants": {"acme": {}}}
    gw = start_gateway(tmp_path, seed_with=seed, admin_password=PASSWORD)
    failed: list[str] = []
    start = time.monotonic()

    def client() -> None:
        with httpx.Client(base_url=gw.api_url, headers={"Authorization": f"Bearer {gw.keys['acme']}"}) as c:
            while time.monotonic() < start + 12.0:
                answer = c.post("/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 6}, timeout=60)
                if answer.status_code != 200:
                    failed.append(answer.text)

    try:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        running: list[float] = []  # laneway's running count on the replica, sampled once it learned
        while any(t.is_alive() for t in threads):
            if time.monotonic() > start + 7.0:
                metrics = httpx.get(gw.base_url + "/metrics").text
                running.append(reading(metrics, "laneway_requests_running", 'deployment="sim-sim"', 'lane="standard"'))
            time.sleep(0.05)
        for t in threads:
            t.join()
        assert not failed, failed[:3]
        limit = reading(
            httpx.get(gw.base_url + "/metrics").text, "laneway_replica_concurrency_limit", 'deployment="sim-sim"'
        )
        assert 1 <= limit < 8, limit  # eight at once decode at 250 ms a token: backed off
        # eight clients, and laneway no longer gives the engine all eight (it did before)
        assert running and max(running) < 8, running
        browser = httpx.Client(base_url=gw.base_url)
        csrf = browser.get("/admin/login").text.split('name="csrf_token" value="')[1].split('"')[0]
        form = {"csrf_token": csrf, "username": "admin", "password": PASSWORD}
        assert browser.post("/admin/login", data=form).status_code == 303
        shown = re.search(r'class="concurrency-limit">(\d+) / 8<', browser.get("/admin/models").text)
        assert shown is not None and 1 <= int(shown.group(1)) < 8
    finally:
        gw.stop()
