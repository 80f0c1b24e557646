"""bench/routing.py's parts: the replicas (bench/replica_server.py processes), the workloads
(seeded, so every row is offered the same requests at the same times), and the routers in front
(`laneway serve` with LANEWAY_ROUTING, vllm-router and sglang-router from a venv of their own)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper and server factory
sys.path.insert(0, str(ROOT / "platform"))

from support import EXE, free_port, seed  # noqa: E402

SERVER = Path(__file__).with_name("replica_server.py")
SERVED = "smollm2"  # the replicas' model name, and laneway's alias for them
ROUTERS_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "laneway" / "routers-venv"
PEERS = {"vllm-router": "vllm-router==0.1.17", "sglang-router": "sglang-router==0.3.2"}
WORDS = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue side "
    "kind head house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office door health person "
    "art war history party result change morning reason research girl guy moment air teacher force education "
    "river garden bridge market winter summer letter window table paper music field road station"
).split()


def child_env(**extra: str) -> dict[str, str]:
    """The environment of the processes the bench starts: this tree's laneway first."""
    path = os.pathsep.join(p for p in (str(ROOT / "platform"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def stop_process(proc: subprocess.Popen[bytes], within: float = 20.0) -> None:
    """SIGTERM its process group, SIGKILL what is left after `within`."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_http(url: str, proc: subprocess.Popen[bytes], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} within {within:.0f} s")
        time.sleep(0.2)


# ---- the replicas ---------------------------------------------------------------------------


class Replicas:
    """N replica_server processes of one model, each its own llama.cpp context and cache."""

    def __init__(self, model: Path, n: int, work: Path, *, n_ctx: int, threads: int, cache_bytes: int) -> None:
        self.urls: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.n_ctx = n_ctx
        try:
            for i in range(n):
                port = free_port()
                with (work / f"replica-{i}.log").open("wb") as log:
                    self.procs.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                str(SERVER),
                                "--model",
                                str(model),
                                "--port",
                                str(port),
                                "--served-name",
                                SERVED,
                                "--n-ctx",
                                str(n_ctx),
                                "--threads",
                                str(threads),
                                "--cache-bytes",
                                str(cache_bytes),
                            ],
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                            env=child_env(),
                        )
                    )
                self.urls.append(f"http://127.0.0.1:{port}")
            for url, proc in zip(self.urls, self.procs, strict=True):
                wait_http(url + "/health", proc, 120, f"replica {url}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)

    def call(self, method: str, path: str, url: str | None = None, **kw: Any) -> Any:
        r = httpx.request(method, (url or self.urls[0]) + path, timeout=600, **kw)
        r.raise_for_status()
        return r.json()

    def idle(self, within: float = 180.0) -> bool:
        """Wait until no replica runs or queues anything (what a row left behind)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            m = self.metrics()
            if not any(r["vllm:num_requests_running"] + r["vllm:num_requests_waiting"] for r in m):
                return True
            time.sleep(0.5)
        return False

    def reset(self, cache_bytes: int | None = None) -> None:
        """Every replica's prefix cache emptied (and resized): a row starts cold."""
        for url in self.urls:
            self.call("POST", "/reset", url, json={"cache_bytes": cache_bytes} if cache_bytes else {})

    def metrics(self) -> list[dict[str, float]]:
        out = []
        for url in self.urls:
            values: dict[str, float] = {}
            for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
                if line and not line.startswith("#"):
                    name = line.split("{", 1)[0]
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            out.append(values)
        return out

    def tokens(self, **body: Any) -> int:
        return int(self.call("POST", "/tokenize", json=body)["count"])


# ---- the workloads --------------------------------------------------------------------------


@dataclass
class Sizes:
    groups: int = 6
    prefix_tokens: int = 1024
    shared_rate: float = 0.25
    shared_s: float = 100.0
    sessions_rate: float = 0.2
    sessions_s: float = 60.0
    session_system_tokens: int = 512
    turns: int = 6
    think_s: float = 8.0  # a user's mean pause before each next turn (exponential)
    unique_rate: float = 0.4
    unique_s: float = 30.0
    unique_tokens: int = 256
    max_tokens: int = 32


def arrivals(rng: random.Random, rate: float, seconds: float) -> list[float]:
    """Poisson arrival times in [0, seconds)."""
    out, t = [], rng.expovariate(rate)
    while t < seconds:
        out.append(round(t, 4))
        t += rng.expovariate(rate)
    return out


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Workloads:
    """The three workloads' requests, sized in the replicas' own tokens."""

    def __init__(self, sizes: Sizes, replicas: Replicas, seed_: int = 27) -> None:
        self.sizes, self.seed = sizes, seed_
        sample = text(random.Random(seed_), 400)
        self.words_per_token = 400 / replicas.tokens(prompt=sample)
        rng = random.Random(seed_ + 1)
        self.systems = [
            f"Group {g} handbook. " + text(rng, self._words(sizes.prefix_tokens)) for g in range(sizes.groups)
        ]
        self.system_tokens = [replicas.tokens(messages=[{"role": "system", "content": s}]) for s in self.systems]

    def _words(self, tokens: int) -> int:
        return max(1, round(tokens * self.words_per_token))

    def question(self, rng: random.Random) -> str:
        return f"In one sentence: what does the text say about the {rng.choice(WORDS)} and the {rng.choice(WORDS)}?"

    def shared(self) -> dict[str, Any]:
        rng, s = random.Random(self.seed + 2), self.sizes
        requests = []
        for at in arrivals(rng, s.shared_rate, s.shared_s):
            g = rng.randrange(s.groups)
            messages = [{"role": "system", "content": self.systems[g]}, {"role": "user", "content": self.question(rng)}]
            requests.append({"at": at, "messages": messages, "max_tokens": s.max_tokens})
        return {"requests": requests}

    def sessions(self) -> dict[str, Any]:
        rng, s = random.Random(self.seed + 3), self.sizes
        sessions = []
        for i, at in enumerate(arrivals(rng, s.sessions_rate, s.sessions_s)):
            system = f"Session {i} notes. " + text(rng, self._words(s.session_system_tokens))
            turns = [f"{text(rng, 12)}. {self.question(rng)}" for _ in range(s.turns)]
            think = [round(rng.expovariate(1 / s.think_s), 3) if s.think_s > 0 else 0.0 for _ in turns[1:]]
            sessions.append(
                {
                    "at": at,
                    "id": f"session-{i}",
                    "system": system,
                    "turns": turns,
                    "think": think,
                    "max_tokens": s.max_tokens,
                }
            )
        return {"sessions": sessions}

    def unique(self) -> dict[str, Any]:
        rng, s = random.Random(self.seed + 4), self.sizes
        requests = []
        for i, at in enumerate(arrivals(rng, s.unique_rate, s.unique_s)):
            # A system prompt of its own: without one the template adds its default, shared by all.
            system = f"Note {i}. " + text(rng, self._words(s.unique_tokens))
            messages = [{"role": "system", "content": system}, {"role": "user", "content": self.question(rng)}]
            requests.append({"at": at, "messages": messages, "max_tokens": s.max_tokens})
        return {"requests": requests}


# ---- the routers ----------------------------------------------------------------------------


@dataclass
class Front:
    """A router in front of the replicas, as the load generator calls it."""

    base_url: str  # .../v1
    api_key: str
    model: str


LANE = {
    "name": "bench",
    "priority": 0,
    "max_concurrency": 512,
    "max_queue_depth": 4096,
    "queue_timeout_s": 600.0,
    "max_unacked_tokens": 1_000_000,
}


@contextmanager
def laneway(work: Path, replicas: Replicas, routing: str, slots: int) -> Iterator[Front]:
    """`laneway serve` (this tree's) with the replicas as one alias of three vLLM deployments."""
    config = {
        "model": SERVED,
        "tokenize": "never",
        "metrics_poll_s": 0.25,
        "shared_slots": False,
        "max_concurrency": slots,
    }
    deployments = [
        {
            "name": f"{SERVED}-{i}",
            "engine_kind": "vllm",
            "max_model_len": replicas.n_ctx,
            "config": {**config, "base_url": url},
        }
        for i, url in enumerate(replicas.urls)
    ]
    url = f"sqlite+aiosqlite:///{work / f'laneway-{routing}.db'}"
    keys = asyncio.run(seed(url, models={SERVED: deployments}, lanes=[LANE], tenants={"bench": {}}))
    data = work / f"laneway-{routing}"
    data.mkdir(exist_ok=True)
    # The replicas share the gateway's two cores here (GPU engines would not): its event loop
    # lags behind them, and the loop-delay shedding would refuse requests for that.
    env = child_env(
        LANEWAY_DATA_DIR=str(data),
        LANEWAY_DATABASE_URL=url,
        LANEWAY_BOOTSTRAP_DEMO="false",
        LANEWAY_ADMIN_PASSWORD="bench-admin-password",
        LANEWAY_LOG_LEVEL="warning",
        LANEWAY_ROUTING=routing,
        LANEWAY_SHED_LOOP_DELAY_S="0",
    )
    port = free_port()
    with (work / f"laneway-{routing}.log").open("ab") as log:
        proc = subprocess.Popen(
            [EXE, "serve"],
            env={**env, "LANEWAY_PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Ready once every deployment is warm: laneway's warm-up computes a prompt of half the
        # context on each replica, tens of seconds on one busy core.
        wait_http(f"http://127.0.0.1:{port}/health/ready", proc, 300, "laneway serve")
        yield Front(f"http://127.0.0.1:{port}/v1", keys["bench"], SERVED)
    finally:
        stop_process(proc, within=30)


def peer_binary(name: str, log: Path) -> Path:
    """The peer's console script in ROUTERS_VENV, installed with pip on first use."""
    exe = ROUTERS_VENV / "bin" / name
    if exe.exists():
        return exe
    with log.open("ab") as out:
        if not (ROUTERS_VENV / "bin" / "pip").exists():
            subprocess.run(
                [sys.executable, "-m", "venv", "--clear", str(ROUTERS_VENV)],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        done = subprocess.run(
            [str(ROUTERS_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", PEERS[name]],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    if done.returncode != 0 or not exe.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"pip install {PEERS[name]} failed: {tail[0][:160]}")
    return exe


@contextmanager
def peer(name: str, work: Path, replicas: Replicas) -> Iterator[Front]:
    """vllm-router or sglang-router, cache_aware, its other settings at their defaults."""
    log = work / f"{name}.log"
    exe = peer_binary(name, log)
    port = free_port()
    cmd = [
        str(exe),
        *(["launch"] if name == "sglang-router" else []),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *replicas.urls,
        "--policy",
        "cache_aware",
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warning" if name == "vllm-router" else "warn",
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, 60, name)
        yield Front(f"http://127.0.0.1:{port}/v1", "none", SERVED)
    finally:
        stop_process(proc)
