"""The latency model learns a real (simulated) replica through the gateway: the sim engine is
given a known cost curve, requests run through the app, and the figures /metrics and the
admin's models page show are the sim's own within 25 % (the unit tests hold the model itself
to 5 % on exact observations; here the sim's sleeps stretch with the machine's load, a
parallel suite on 2 cores, so this test proves the wiring, not the estimator's precision).

First short prompts at a concurrency that changes every 1.25 s (the step curve: decode gaps at
batches of 1 to 8), then prompts of random length one at a time (the prefill rate: TTFT against
the uncached tokens). Long prompts run at once would stall every batch with their prefill, as
they do in an engine, which the model allows for, but with more noise than a 20-second test
can average out on a loaded machine."""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import httpx
from support import sim_model, start_gateway

PASSWORD = "correct horse battery"
BASE_S, PER_SEQ_S, PREFILL_S = 0.020, 0.005, 40e-6  # the sim's step = base + per_seq x batch; prefill per token
SIM = {
    "max_concurrency": 8,
    "decode_ms_base": BASE_S * 1000,
    "decode_ms_per_seq": PER_SEQ_S * 1000,
    "prefill_ms_per_token": PREFILL_S * 1000,
}
PHASES = (1, 4, 8, 2, 6, 3, 8)  # concurrency, 1.25 s each
LANES = [{"name": "standard", "priority": 0, "max_concurrency": 8, "max_queue_depth": 100, "queue_timeout_s": 30}]


def gauge(metrics: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        if line.startswith(f"{name}{{") and line.split("}")[0][len(name) + 1 :] == wanted:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} not in /metrics")


def drive(api_url: str, key: str) -> int:
    """The two workloads; returns how many requests ran."""
    done, failed = [0], []
    lock = threading.Lock()

    def run(client: httpx.Client, tokens: int, max_tokens: int) -> None:
        body = {"model": "sim", "prompt": "abcd" * tokens, "max_tokens": max_tokens}  # 4 characters a token
        answer = client.post("/completions", json=body)
        with lock:
            done[0] += answer.status_code == 200
            if answer.status_code != 200:
                failed.append(answer.text)

    def client() -> httpx.Client:
        return httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)

    started = time.monotonic()

    def decoder(i: int) -> None:  # as many at once as the phase allows, short prompts
        rng = random.Random(i)
        with client() as c:
            while (phase := int((time.monotonic() - started) / 1.25)) < len(PHASES):
                if i < PHASES[phase]:
                    run(c, 25, rng.randint(12, 24))
                else:
                    time.sleep(0.02)

    threads = [threading.Thread(target=decoder, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rng = random.Random(99)
    with client() as c:  # one at a time, prompts of 100 to 4000 tokens
        for _ in range(60):
            run(c, rng.randint(100, 4000), 2)
    assert not failed, failed[:3]
    return done[0]


TOLERANCE = 0.25


def test_the_model_learns_the_sims_known_curve_and_shows_it(tmp_path: Path) -> None:
    seed = {"models": {"sim": sim_model("sim", **SIM)}, "lanes": LANES, "tenants": {"acme": {}}}
    gw = start_gateway(tmp_path, seed_with=seed, admin_password=PASSWORD, default_max_tokens=64)
    try:
        assert drive(gw.api_url, gw.keys["acme"]) >= 100
        metrics = httpx.get(gw.base_url + "/metrics").text
        learned = gauge(metrics, "laneway_replica_prefill_seconds_per_token", deployment="sim-sim")
        assert abs(learned - PREFILL_S) <= TOLERANCE * PREFILL_S, learned
        for running in (1, 2, 4, 8):  # the curve's points for 8 slots
            step = gauge(metrics, "laneway_replica_step_seconds", deployment="sim-sim", running=str(running))
            true = BASE_S + PER_SEQ_S * running
            assert abs(step - true) <= TOLERANCE * true, (running, step, true)
        count = gauge(metrics, "laneway_ttft_prediction_error_count", model="sim", deployment="sim-sim")
        assert count > 60  # every request but the first few was predicted
        mape = gauge(metrics, "laneway_replica_ttft_prediction_mape", deployment="sim-sim")
        assert 0 <= mape < 0.5

        browser = httpx.Client(base_url=gw.base_url)
        csrf = browser.get("/admin/login").text.split('name="csrf_token" value="')[1].split('"')[0]
        form = {"csrf_token": csrf, "username": "admin", "password": PASSWORD}
        assert browser.post("/admin/login", data=form).status_code == 303
        page = browser.get("/admin/models").text
        shown = re.search(r'class="prefill-rate">([\d.]+) ms per 1k tokens<', page)
        assert (
            shown is not None and abs(float(shown.group(1)) - learned * 1e6) <= 0.01 * learned * 1e6 + 0.01
        )  # what /metrics said
        assert re.search(r'class="step-curve">1: [\d.]+ ms, 2: [\d.]+ ms, 4: [\d.]+ ms, 8: [\d.]+ ms<', page)
        assert re.search(r'class="ttft-error">\d+% \(of \d+ recent\)<', page)
    finally:
        gw.stop()
