"""What laneway costs on top of the engine: latency, CPU per request, and behaviour past capacity.

Setup, all on this machine: a fake OpenAI-protocol engine that answers at once
(bench/upstream.py, 16 tokens per answer), `laneway serve` in front of it as a vLLM
deployment, pinned to ONE core (taskset; the gateways not measured in a row wait on the
other), and an open-loop load generator (bench/loadgen.py:
a fixed arrival rate, latency measured from each request's scheduled send time, so a server
that falls behind cannot hide it). The engine and the load generator share the other core.
- direct: the load generator calls the fake engine itself (the baseline, same run).
- laneway (memory): rate limits in process memory; (redis limits): in a private redis-server
  (on the other core too, as on another host: its work is not the gateway's);
  (redis limits + shared slots): the engine's slots shared through Redis too, as when several
  replicas front it (core/shared_slots/; two more round trips per request).
- litellm proxy (when its `litellm` executable is found; not a dependency): LiteLLM's proxy
  in front of the same engine, one worker on the gateway's core, at rates it can sustain
  (--litellm-rates), beside direct and laneway (memory) at those rates.
For each rate: p50/p99/max latency of the successful requests, success rate, achieved
requests per second, and the gateway's CPU time per request from /proc (utime + stime,
background work included). Then the capacity (a ramp of 25 % steps from 100/s, each row from a
settled gateway, until p99 passes 100 ms) and a row at 5x it: goodput (successful requests per
second) and how fast the excess was refused (503), with the default shedding, again with
the optional cpu signal (LANEWAY_SHED_CPU_TARGET=0.9) on a fourth gateway, on a fifth
without the surge acceptors (LANEWAY_HTTP_ACCEPT_FANOUT=1: one new connection a loop turn),
and on a sixth without the standing backlog's low cap (LANEWAY_SHED_STANDING_PREPARING=0:
the hard cap of 64 alone, as before it).
Goals (issue "ten times less CPU"): CPU <= 0.5 ms per non-streaming request and <= 1.0 ms per
16-chunk stream; overhead p50 <= 1 ms and p99 <= 3 ms at 300 RPS; >= 1,000 RPS per core with
p99 < 100 ms; at 5x, goodput >= 0.9 of capacity, refused in a few ms; redis within 15 % of
memory.

Run: .venv/bin/python bench/overhead.py [--seconds 5] [--rates 100 300 1000] [--overload-only]
     [--overload-rounds N] [--litellm BIN] [--litellm-rates 20 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper, server factory, private Redis

from support import (  # noqa: E402
    PrivateRedis,
    free_port,
    seed,
    serve,
)

PY = sys.executable
GATEWAY_CORE, OTHER_CORE = "0", "1"
BODY = {"model": "m", "prompt": "hello there, how are you", "max_tokens": 16}
# The measured tenant has every limit set, none of them near: each is checked on every request.
BENCH_LIMITS = {"rpm": 10_000_000, "tpm": 1_000_000_000, "max_concurrency": 100_000, "tokens_per_day": 10**12}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinned(core: str, *cmd: str) -> list[str]:
    return ["taskset", "-c", core, *cmd] if shutil.which("taskset") else list(cmd)


def load_cmd(
    url: str,
    rate: float,
    seconds: float,
    key: str | None,
    stream: bool,
    body: dict[str, Any] | None = None,
    timeline: bool = False,
) -> list[str]:
    cmd = pinned(
        OTHER_CORE,
        PY,
        str(ROOT / "bench" / "loadgen.py"),
        url,
        "--rate",
        str(rate),
        "--seconds",
        str(seconds),
        "--body",
        json.dumps(body or BODY),
    )
    if key:
        cmd += ["--key", key]
    if stream:
        cmd.append("--stream")
    if timeline:
        cmd.append("--timeline")
    return cmd


def load(
    url: str,
    rate: float,
    seconds: float,
    key: str | None,
    stream: bool,
    body: dict[str, Any] | None = None,
    timeline: bool = False,
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        cmd = [*load_cmd(url, rate, seconds, key, stream, body, timeline), "--out", result.name]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 20 + 60)
        text = result.read()
    try:
        return dict(json.loads(text))
    except json.JSONDecodeError as exc:  # say what the load generator wrote instead
        around = text[max(0, exc.pos - 200) : exc.pos + 200]
        raise SystemExit(
            f"the load generator's output is not its JSON ({exc}; exit {out.returncode}): "
            f"...{around!r}... stderr: {out.stderr[-2000:]}"
        ) from None


@contextmanager
def bench_services() -> Iterator[tuple[Path, str, PrivateRedis]]:
    """A work directory, the fake engine (on the other core) and a private redis-server."""
    work = Path(tempfile.mkdtemp(prefix="lw-overhead-"))
    up_port = free_port()
    upstream = subprocess.Popen(pinned(OTHER_CORE, PY, str(ROOT / "bench" / "upstream.py"), "--port", str(up_port)))
    redis = PrivateRedis().start()
    if redis.proc is not None:  # Redis's work is not the gateway's: not on its core
        pin(redis.proc, OTHER_CORE)
    time.sleep(0.5)
    try:
        yield work, f"http://127.0.0.1:{up_port}", redis
    finally:
        redis.stop()
        upstream.terminate()


def seed_with_tree(url: str, what: dict[str, Any], platform_path: str | None) -> dict[str, str]:
    """Seed with this tree's code, or, for another tree (--ab), with that tree's: its
    migrations are the ones its gateway will find in the database."""
    if platform_path is None:
        return asyncio.run(seed(url, **what))
    seeding = Path(__file__).resolve().parents[1] / "tests" / "support" / "seeding.py"
    code = (
        "import asyncio, importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('seeding', sys.argv[1])\n"
        "module = sys.modules['seeding'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(json.dumps(asyncio.run(module.seed(sys.argv[2], **json.loads(sys.argv[3])))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(seeding), url, json.dumps(what)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": platform_path},
    )
    keys: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return keys


@contextmanager
def gateway(
    upstream: str,
    work: Path,
    redis_url: str | None,
    *,
    shared_slots: bool = True,
    env_extra: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], int, str]]:
    url = f"sqlite+aiosqlite:///{work / f'overhead-{time.time_ns()}.db'}"
    config = {
        "base_url": upstream,
        "model": "m",
        "max_concurrency": 1024,
        "metrics_poll_s": 1.0,
        "shared_slots": shared_slots,
    }
    # "long": a second deployment of the same engine, for the long-prompt flood.
    models = {
        alias: [{"name": f"{alias}-vllm", "engine_kind": "vllm", "max_model_len": 100_000, "config": config}]
        for alias in ("m", "long")
    }
    lanes = [
        {
            "name": "standard",
            "max_concurrency": 1024,
            "max_queue_depth": 4096,
            "queue_timeout_s": 30,
            "max_unacked_tokens": 100_000,
        }
    ]
    what = {"models": models, "lanes": lanes, "tenants": {"bench": BENCH_LIMITS, "flood": {}}}
    keys = seed_with_tree(url, what, (env_extra or {}).get("PYTHONPATH"))
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(work / f"data-{time.time_ns()}"),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_LOG_LEVEL": "warning",
    }
    if redis_url:
        env["LANEWAY_REDIS_URL"] = redis_url
    env.update(env_extra or {})
    proc, port = serve(env)
    pin(proc, GATEWAY_CORE)
    GATEWAYS.append(proc)
    try:
        FLOOD_KEYS[port] = keys["flood"]
        yield proc, port, keys["bench"]
    finally:
        GATEWAYS.remove(proc)
        proc.terminate()
        proc.wait(30)


GATEWAYS: list[subprocess.Popen[bytes]] = []  # the gateways running, for alone_on_core


def pin(proc: subprocess.Popen[bytes], core: str) -> None:
    if shutil.which("taskset"):
        subprocess.run(["taskset", "-apc", core, str(proc.pid)], capture_output=True, check=False)


def alone_on_core(proc: subprocess.Popen[bytes]) -> None:
    """The measured gateway alone on its core, the others (idle, but each with its ticks and
    sweeps) moved to the other core: up to six run at once, and at 5x their few percent of
    the core were taken from the measured one's goodput."""
    for other in GATEWAYS:
        pin(other, GATEWAY_CORE if other is proc else OTHER_CORE)


LITELLM_KEY = "sk-bench"


@contextmanager
def litellm_proxy(
    binary: str | None, upstream: str, work: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int] | None]:
    """LiteLLM's proxy in front of the same fake engine, for a column of comparison: one worker
    on the gateway's core, a master key (auth, no limits or usage database), its logging at
    ERROR. None when no `litellm` executable is given or found (it is not a dependency)."""
    if not binary:
        yield None
        return
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(f"""model_list:
  - model_name: m
    litellm_params:
      model: openai/m
      api_base: {upstream}/v1
      api_key: none
general_settings:
  master_key: {LITELLM_KEY}
""")
    log = work / "litellm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            pinned(GATEWAY_CORE, binary, "--config", str(config), "--port", str(port), "--num_workers", "1"),
            env={**os.environ, "LITELLM_LOG": "ERROR"},
            stdout=out,
            stderr=out,
        )
    GATEWAYS.append(proc)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"LiteLLM's proxy did not start; its log:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield proc, port
    finally:
        GATEWAYS.remove(proc)
        proc.terminate()
        proc.wait(30)


def litellm_rows(
    litellm: tuple[subprocess.Popen[bytes], int],
    memory: tuple[subprocess.Popen[bytes], int, str],
    up_url: str,
    rates: list[float],
    seconds: float,
) -> list[dict[str, Any]]:
    """Direct, laneway (memory) and LiteLLM's proxy at rates LiteLLM can sustain (plus 16-chunk
    streams at the lowest), each LiteLLM row followed by a wait until it is idle again: behind
    a rate it cannot keep up with it works through its backlog for seconds, on a core that the
    next rows need."""
    (ll, ll_port), (mem, mem_port, mem_key) = litellm, memory
    out: list[dict[str, Any]] = []
    for rate in rates:
        out.append(row("direct", rate, load(up_url + "/v1/completions", rate, seconds, None, False), None))
        out.append(measure(mem_port, mem, mem_key, "laneway (memory)", rate, seconds))
        out.append(measure(ll_port, ll, LITELLM_KEY, "litellm proxy", rate, seconds))
        idle(ll)
    rate = min(rates)
    out.append(row("direct, 16-chunk streams", rate, load(up_url + "/v1/completions", rate, seconds, None, True), None))
    out.append(measure(mem_port, mem, mem_key, "laneway (memory), 16-chunk streams", rate, seconds, stream=True))
    out.append(measure(ll_port, ll, LITELLM_KEY, "litellm proxy, 16-chunk streams", rate, seconds, stream=True))
    idle(ll)
    return out


def idle(proc: subprocess.Popen[bytes], limit_s: float = 60.0) -> None:
    """Wait until `proc` uses under 5 % of a core over half a second (or limit_s passes)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_seconds(proc.pid)
        time.sleep(0.5)
        if cpu_seconds(proc.pid) - before < 0.025:
            return


def row(label: str, rate: float, res: dict[str, Any], cpu_ms: float | None) -> dict[str, Any]:
    ok = res["latencies"].get("200", [])
    # After the onset: the load generator opens a new connection for each request while none
    # is idle, so the first ~250 ms of a 5x row are a connection surge as well.
    after_onset = [e for e in res.get("timeline", []) if e[0] >= 1.0]
    refused = res["latencies"].get("503", [])
    return {
        "label": label,
        "rate": rate,
        "p50": pct(ok, 0.5),
        "p99": pct(ok, 0.99),
        "max": max(ok, default=float("nan")),
        "success": len(ok) / max(1, res["sent"]),
        "rps": len(ok) / res["elapsed"],
        "cpu_ms": cpu_ms,
        "refused": len(refused),
        "refused_p50": pct(refused, 0.5),
        "refused_p99": pct(refused, 0.99),
        "timeouts": res["timeouts"] + res["errors"],
        "ttfb_p50": pct(res.get("ttfb", []), 0.5),
        "ttfb_p99": pct(res.get("ttfb", []), 0.99),
        "late_p99": pct(res.get("late", []), 0.99),
        "gen_busy": res.get("cpu_s", float("nan")) / res["elapsed"],  # the load generator's share of its core
        "refused_after_1s_p99": pct([e[2] for e in after_onset if e[1] == 503], 0.99),
        # ... and from the request's write: without the load generator's own lateness (nor a
        # new connection's connect, which is partly the gateway's accept).
        "refused_after_1s_written_p99": pct([e[2] - e[3] for e in after_onset if e[1] == 503], 0.99),
    }


def measure(
    port: int,
    proc: subprocess.Popen[bytes],
    key: str,
    label: str,
    rate: float,
    seconds: float,
    stream: bool = False,
    body: dict[str, Any] | None = None,
    timeline: bool = False,
) -> dict[str, Any]:
    alone_on_core(proc)
    before = cpu_seconds(proc.pid)
    res = load(f"http://127.0.0.1:{port}/v1/completions", rate, seconds, key, stream, body, timeline)
    used = cpu_seconds(proc.pid) - before
    ok = len(res["latencies"].get("200", []))
    return {**row(label, rate, res, used * 1000 / max(1, ok)), "core_busy": used / res["elapsed"]}


SHORT_RATE, LONG_RATE = 100.0, 100.0
LONG_BODY = {"model": "long", "prompt": "lorem ipsum dolor sit amet " * 600, "max_tokens": 16}  # ~16 KB
IDLE_S = 10.0
FLOOD_KEYS: dict[int, str] = {}  # gateway port -> the flooding tenant's key


def long_prompt_flood(port: int, proc: subprocess.Popen[bytes], key: str, seconds: float) -> list[dict[str, Any]]:
    """Short streams alone, then again while a flood of long prompts goes to another deployment."""
    short = {**BODY, "stream": True}
    alone = measure(port, proc, key, "alone", SHORT_RATE, seconds, stream=True, body=short)
    url = f"http://127.0.0.1:{port}/v1/completions"
    flood = subprocess.Popen(
        load_cmd(url, LONG_RATE, seconds + 1.0, FLOOD_KEYS[port], False, LONG_BODY), stdout=subprocess.PIPE, text=True
    )
    time.sleep(0.5)  # the flood is under way
    flooded = measure(
        port, proc, key, "during a 4K-token flood on another deployment", SHORT_RATE, seconds, stream=True, body=short
    )
    out, _ = flood.communicate(timeout=seconds * 20 + 60)
    res = json.loads(out)
    flooded["flood_sent"], flooded["flood_ok"] = res["sent"], len(res["latencies"].get("200", []))
    return [alone, flooded]


CAPACITY_START = 100.0
CPU_SHEDDING = {"LANEWAY_SHED_CPU_TARGET": "0.9"}  # the 5x row again with the (optional) cpu signal on
ONE_ACCEPT = {"LANEWAY_HTTP_ACCEPT_FANOUT": "1"}  # and without server.SurgeAcceptors: the baseline
HIGH_CAP_ONLY = {"LANEWAY_SHED_STANDING_PREPARING": "0"}  # and without the standing backlog's low cap


def settle(port: int, quiet_s: float = 1.0, limit_s: float = 20.0) -> None:
    """Wait until the gateway holds no lease (what the last row left behind is done), then a
    moment more: each row starts from a settled gateway, not from its predecessor's backlog."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        found = re.search(r"^laneway_leases_in_flight ([0-9.e+]+)$", text, re.M)
        if found is None or float(found.group(1)) == 0:
            break
        time.sleep(0.2)
    time.sleep(quiet_s)


def find_capacity(
    port: int, proc: subprocess.Popen[bytes], key: str, seconds: float
) -> tuple[float, list[dict[str, Any]]]:
    """Raise the rate by 25 % a step from CAPACITY_START until p99 passes 100 ms or requests
    fail: (the best achieved rate that held, the probe rows)."""
    capacity, probes, rate = 0.0, [], CAPACITY_START
    while rate <= 8000:
        settle(port)
        probe = measure(port, proc, key, "laneway (memory), capacity probe", rate, seconds)
        probes.append(probe)
        if probe["p99"] >= 100 or probe["success"] < 0.99:
            break
        capacity = max(capacity, probe["rps"])
        rate *= 1.25
    return capacity or CAPACITY_START, probes


def overloaded(
    port: int, proc: subprocess.Popen[bytes], key: str, label: str, capacity: float, seconds: float
) -> dict[str, Any]:
    """A row at 5x capacity from a settled gateway, with what its shedder refused by reason."""
    settle(port)
    before = shed_counts(port)
    out = measure(port, proc, key, label + ", 5x capacity", 5 * capacity, seconds, timeline=True)
    out["label"] = label
    out["shed_by"] = {k: v - before.get(k, 0) for k, v in shed_counts(port).items()}
    return out


def shed_counts(port: int) -> dict[str, int]:
    """laneway_shed_total by reason, from the gateway's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    found = re.findall(r'^laneway_shed_total\{reason="(\w+)"\} ([0-9.e+]+)$', text, re.M)
    return {reason: int(float(n)) for reason, n in found}


def fmt(v: float | None, unit: str = " ms", digits: int = 2) -> str:
    if v is None or v != v:  # None or NaN
        return "-"
    return f"{v:.{digits}f}{unit}"


def print_overload(capacity: float, probes: list[dict[str, Any]], overloads: list[dict[str, Any]]) -> None:
    for r in probes:
        print(
            f"| {r['label']} | {r['rate']:.0f}/s | {fmt(r['p50'])} | {fmt(r['p99'])} | {fmt(r['max'], digits=1)} "
            f"| {r['success'] * 100:.1f} % | {r['rps']:.0f} | {fmt(r['cpu_ms'])} |"
        )
    print(
        f"\nCapacity: {capacity:.0f}/s (the best achieved rate of a ramp from {CAPACITY_START:.0f}/s with p99 "
        f"< 100 ms and 99 % success). At 5x ({5 * capacity:.0f}/s offered), from a settled gateway:"
    )
    print(
        "\n| 5x overload | goodput | of capacity | success p50 / p99 | refused (503) | refused p50 / p99 "
        "| refused p99 after 1 s (from the write) | timed out or failed | shed by reason "
        "| gateway core busy | load generator late p99 (busy) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for o in overloads:
        print(
            f"| {o['label']} | {o['rps']:.0f}/s | {o['rps'] / capacity:.2f} | {fmt(o['p50'])} / {fmt(o['p99'])} "
            f"| {o['refused']} | {fmt(o['refused_p50'])} / {fmt(o['refused_p99'])} "
            f"| {fmt(o['refused_after_1s_p99'])} ({fmt(o['refused_after_1s_written_p99'])}) | {o['timeouts']} | "
            + ", ".join(f"{k} {v}" for k, v in o["shed_by"].items() if v)
            + f" | {o['core_busy'] * 100:.0f} % "
            f"| {fmt(o['late_p99'])} ({o['gen_busy'] * 100:.0f} %) |"
        )
    labels = list(dict.fromkeys(o["label"] for o in overloads))
    if len(overloads) > len(labels):  # several rounds: the medians
        print(
            "\n| 5x overload, rounds interleaved | goodput of capacity (median) | every round "
            "| refused p99 after 1 s (median) | every round | the same from the write (median) |\n"
            "|---|---|---|---|---|---|"
        )
        for label in labels:
            mine = [o for o in overloads if o["label"] == label]
            share = [o["rps"] / capacity for o in mine]
            after = [o["refused_after_1s_p99"] for o in mine]
            written = [o["refused_after_1s_written_p99"] for o in mine]
            print(
                f"| {label} | {pct(share, 0.5):.2f} | {' / '.join(f'{v:.2f}' for v in share)} "
                f"| {fmt(pct(after, 0.5))} | {' / '.join(fmt(v, '', 1) for v in after)} "
                f"| {fmt(pct(written, 0.5))} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rates", type=float, nargs="*", default=[100, 300, 1000])
    ap.add_argument("--overload-only", action="store_true", help="only the capacity ramp and the 5x rows")
    ap.add_argument(
        "--litellm",
        default=shutil.which("litellm"),
        metavar="BIN",
        help="LiteLLM's `litellm` executable: rows of its proxy too (default: on PATH)",
    )
    ap.add_argument(
        "--litellm-rates",
        type=float,
        nargs="*",
        default=[20, 50],
        help="the rates of LiteLLM's rows (one worker saturates near 80/s here)",
    )
    ap.add_argument("--overload-rounds", type=int, default=1, help="the 5x rows this many times, interleaved")
    ap.add_argument(
        "--capacity",
        type=float,
        help="take this capacity (a rate a second) instead of the ramp's; "
        "with --ab: a 5x row of it for each tree in each round",
    )
    ap.add_argument("--ab-redis", action="store_true", help="--ab with Redis limits on both trees")
    ap.add_argument(
        "--limits-only",
        type=int,
        metavar="ROUNDS",
        default=0,
        help="only memory vs Redis limits: ROUNDS rounds of the rows, interleaved; the medians and ratios",
    )
    ap.add_argument(
        "--ab",
        nargs=2,
        metavar=("SRC", "ROUNDS"),
        help="only this tree vs another source tree (SRC, e.g. a `git worktree` of main): both with memory "
        "limits, non-streaming and 16-chunk streams, ROUNDS interleaved rounds; the medians and ratios",
    )
    args = ap.parse_args()
    if args.limits_only:
        limits_only(args.rates, args.seconds, args.limits_only)
        return
    if args.ab:
        ab(Path(args.ab[0]), args.rates, args.seconds, int(args.ab[1]), args.ab_redis, args.capacity)
        return
    rows: list[dict[str, Any]] = []
    with bench_services() as (work, up_url, redis):
        with (
            gateway(up_url, work, None) as (mem, mem_port, mem_key),
            gateway(up_url, work, redis.url, shared_slots=False) as (red, red_port, red_key),
            gateway(up_url, work, redis.url) as (shr, shr_port, shr_key),
            gateway(up_url, work, None, env_extra=CPU_SHEDDING) as (cpu, cpu_port, cpu_key),
            gateway(up_url, work, None, env_extra=ONE_ACCEPT) as (one, one_port, one_key),
            gateway(up_url, work, None, env_extra=HIGH_CAP_ONLY) as (high, high_port, high_key),
            litellm_proxy(None if args.overload_only else args.litellm, up_url, work) as litellm,
        ):
            for port, key in (
                (mem_port, mem_key),
                (red_port, red_key),
                (shr_port, shr_key),
                (cpu_port, cpu_key),
                (one_port, one_key),
                (high_port, high_key),
            ):
                load(f"http://127.0.0.1:{port}/v1/completions", 100, 1, key, False)
            for rate in [] if args.overload_only else args.rates:
                direct = load(up_url + "/v1/completions", rate, args.seconds, None, False)
                rows.append(row("direct", rate, direct, None))
                rows.append(measure(mem_port, mem, mem_key, "laneway (memory)", rate, args.seconds))
                rows.append(measure(red_port, red, red_key, "laneway (redis limits)", rate, args.seconds))
                rows.append(
                    measure(shr_port, shr, shr_key, "laneway (redis limits + shared slots)", rate, args.seconds)
                )
            stream_rate = args.rates[min(1, len(args.rates) - 1)]
            if not args.overload_only:
                direct = load(up_url + "/v1/completions", stream_rate, args.seconds, None, True)
                rows.append(row("direct, 16-chunk streams", stream_rate, direct, None))
                rows.append(
                    measure(
                        mem_port,
                        mem,
                        mem_key,
                        "laneway (memory), 16-chunk streams",
                        stream_rate,
                        args.seconds,
                        stream=True,
                    )
                )
                if litellm is not None:
                    rows += litellm_rows(litellm, (mem, mem_port, mem_key), up_url, args.litellm_rates, args.seconds)
            if args.capacity:
                capacity = args.capacity
            else:
                capacity, probes = find_capacity(mem_port, mem, mem_key, args.seconds)
                rows += probes
            variants = [
                (mem_port, mem, mem_key, "laneway (memory)"),
                (cpu_port, cpu, cpu_key, "laneway (memory, cpu shedding at 0.9)"),
                (one_port, one, one_key, "laneway (memory, one accept a loop turn)"),
                (high_port, high, high_key, "laneway (memory, backlog cap 64 alone)"),
            ]
            # Rounds interleaved: a 5x row depends on the load generator's own lateness (it shares
            # a core with the fake engine), so one round can favour any variant.
            overloads = [
                overloaded(port, proc, key, label, capacity, args.seconds)
                for _ in range(args.overload_rounds)
                for port, proc, key, label in variants
            ]
            if args.overload_only:
                print_overload(capacity, rows, overloads)
                return
            # Every gateway settled first: they share one core, and one still draining its 5x
            # backlog (queued requests wait up to 30 s) slowed and failed the next rows.
            for port in (mem_port, red_port, shr_port, cpu_port, one_port, high_port):
                settle(port, quiet_s=0.2, limit_s=40.0)
            long_rows = long_prompt_flood(mem_port, mem, mem_key, args.seconds)
            idle_cpu = {"memory": mem, "redis limits + shared slots": shr}
            # Two windows: the first seconds after traffic still run the API key sweeps (keys used
            # within LANEWAY_AUTH_KEEP_WARM_S, 10 s) and the last flushes; then the gateway at rest.
            idle_after: list[dict[str, float]] = []
            for _ in range(2):
                before = {label: cpu_seconds(p.pid) for label, p in idle_cpu.items()}
                time.sleep(IDLE_S)
                idle_after.append(
                    {label: (cpu_seconds(p.pid) - before[label]) / IDLE_S * 100 for label, p in idle_cpu.items()}
                )
    print(
        f"# bench/overhead.py on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}); "
        f"gateway pinned to core {GATEWAY_CORE}; {args.seconds:g} s per row; answers of 16 tokens"
    )
    print("\n| client | rate | p50 | p99 | max | success | achieved RPS | gateway CPU / request |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['label']} | {r['rate']:.0f}/s | {fmt(r['p50'])} | {fmt(r['p99'])} | {fmt(r['max'], digits=1)} "
            f"| {r['success'] * 100:.1f} % | {r['rps']:.0f} | {fmt(r['cpu_ms'])} |"
        )
    print("\n| overhead vs direct | rate | p50 | p99 |\n|---|---|---|---|")
    direct = {r["rate"]: r for r in rows if r["label"] == "direct"}
    for r in rows:
        if r["label"].startswith(("laneway", "litellm")) and r["rate"] in direct and "stream" not in r["label"]:
            d = direct[r["rate"]]
            print(f"| {r['label']} | {r['rate']:.0f}/s | {fmt(r['p50'] - d['p50'])} | {fmt(r['p99'] - d['p99'])} |")
    print_overload(capacity, [], overloads)
    print(
        f"\nLong prompts: short streams ({SHORT_RATE:.0f}/s) to one deployment, alone and while another "
        f"tenant sends {LONG_RATE:.0f}/s prompts of ~4K tokens ({len(LONG_BODY['prompt']) // 1024} KB) to another."
    )
    print("\n| short streams | TTFT p50 | TTFT p99 | e2e p99 | success | gateway CPU / request |")
    print("|---|---|---|---|---|---|")
    for r in long_rows:
        print(
            f"| {r['label']} | {fmt(r['ttfb_p50'])} | {fmt(r['ttfb_p99'])} | {fmt(r['p99'])} "
            f"| {r['success'] * 100:.1f} % | {fmt(r['cpu_ms'])} |"
        )
    alone, flooded = long_rows
    print(
        f"TTFT p99 during the flood / alone: {flooded['ttfb_p99'] / alone['ttfb_p99']:.2f}x (goal <= 1.5x); "
        f"the flood's own requests: {flooded['flood_ok']} of {flooded['flood_sent']} answered 200."
    )
    for window, idle_pct in zip(("the first", "the next"), idle_after, strict=True):
        print(
            f"\nIdle ({window} {IDLE_S:g} s without requests): gateway CPU "
            + ", ".join(f"{label} {pct_:.2f} % of a core" for label, pct_ in idle_pct.items())
            + " (goal < 1 %)."
        )


def limits_only(rates: list[float], seconds: float, rounds: int) -> None:
    """Memory vs Redis limits (vs Redis limits + shared slots), the rows interleaved round after
    round so a change in the machine's load hits every mode alike; the medians, and each Redis
    mode's ratio to memory's."""
    modes = ("memory", "redis limits", "redis limits + shared slots")
    got: dict[tuple[str, float], list[dict[str, Any]]] = {}
    redis_us: dict[tuple[str, float], list[float]] = {}
    with bench_services() as (work, up_url, redis):
        with (
            gateway(up_url, work, None) as mem,
            gateway(up_url, work, redis.url, shared_slots=False) as red,
            gateway(up_url, work, redis.url) as shr,
        ):
            gateways = dict(zip(modes, (mem, red, shr), strict=True))
            for _, port, key in gateways.values():  # warm all up
                load(f"http://127.0.0.1:{port}/v1/completions", 100, 1, key, False)
            for _ in range(rounds):
                for rate in rates:
                    for mode, (proc, port, key) in gateways.items():
                        before = asyncio.run(redis_usec(redis.url))
                        r = measure(port, proc, key, mode, rate, seconds)
                        spent = asyncio.run(redis_usec(redis.url)) - before
                        got.setdefault((mode, rate), []).append(r)
                        redis_us.setdefault((mode, rate), []).append(spent / max(1, r["rps"] * seconds))
    print(
        f"# bench/overhead.py --limits-only {rounds} on {platform.node()} ({os.cpu_count()} CPUs); gateway pinned "
        f"to core {GATEWAY_CORE}; {seconds:g} s per row; medians of {rounds} interleaved rounds"
    )
    print("\n| mode | rate | p50 | p99 | success | gateway CPU / request | vs memory | Redis time / request |")
    print("|---|---|---|---|---|---|---|---|")
    for rate in rates:
        base = pct([r["cpu_ms"] for r in got[("memory", rate)]], 0.5)
        for mode in modes:
            rs = got[(mode, rate)]
            cpu = pct([r["cpu_ms"] for r in rs], 0.5)
            print(
                f"| {mode} | {rate:.0f}/s | {fmt(pct([r['p50'] for r in rs], 0.5))} "
                f"| {fmt(pct([r['p99'] for r in rs], 0.5))} | {pct([r['success'] for r in rs], 0.5) * 100:.1f} % "
                f"| {fmt(cpu)} | {cpu / base:.2f}x | {pct(redis_us[(mode, rate)], 0.5):.0f} us |"
            )
    print(
        "\nAll rounds, CPU / request (ms): "
        + "; ".join(
            f"{mode} {rate:.0f}/s " + " ".join(f"{r['cpu_ms']:.2f}" for r in got[(mode, rate)])
            for rate in rates
            for mode in modes
        )
    )


def ab(
    src: Path,
    rates: list[float],
    seconds: float,
    rounds: int,
    redis_limits: bool = False,
    capacity: float | None = None,
) -> None:
    """This tree against another source tree (its `platform/` first on PYTHONPATH), same fake
    engine, memory limits (or Redis limits: `redis_limits`), rows interleaved round after round;
    the medians, and this tree's ratio to the other (the baseline). With `capacity`, each round
    also has a 5x row for each tree (5x that rate)."""
    other = src.resolve() / "platform"
    if not (other / "laneway").is_dir():
        raise SystemExit(f"{src} has no platform/laneway")
    trees = {"baseline": {"PYTHONPATH": str(other)}, "this tree": {}}
    kinds = {"non-streaming": False, "16-chunk streams": True}
    got: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    with bench_services() as (work, up_url, redis):
        limits = redis.url if redis_limits else None
        with (
            gateway(up_url, work, limits, shared_slots=False, env_extra=trees["baseline"]) as base,
            gateway(up_url, work, limits, shared_slots=False) as this,
        ):
            gateways = {"baseline": base, "this tree": this}
            for _, port, key in gateways.values():
                load(f"http://127.0.0.1:{port}/v1/completions", 100, 1, key, False)
            for _ in range(rounds):
                for rate in rates:
                    for kind, stream in kinds.items():
                        for tree, (proc, port, key) in gateways.items():
                            settle(port, quiet_s=0.3)
                            r = measure(port, proc, key, tree, rate, seconds, stream=stream)
                            got.setdefault((tree, kind, rate), []).append(r)
                if capacity:
                    for tree, (proc, port, key) in gateways.items():
                        got.setdefault((tree, "5x", 5 * capacity), []).append(
                            overloaded(port, proc, key, tree, capacity, seconds)
                        )
    print(
        f"# bench/overhead.py --ab {src} {rounds} on {platform.node()} ({os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}); gateway pinned to core {GATEWAY_CORE}; {seconds:g} s per row; medians of "
        f"{rounds} interleaved rounds; {'redis' if redis_limits else 'memory'} limits"
    )
    print("\n| kind | rate | tree | p50 | p99 | success | gateway CPU / request | vs baseline | every round |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rate in rates:
        for kind in kinds:
            base_cpu = pct([r["cpu_ms"] for r in got[("baseline", kind, rate)]], 0.5)
            for tree in trees:
                rs = got[(tree, kind, rate)]
                cpu = pct([r["cpu_ms"] for r in rs], 0.5)
                print(
                    f"| {kind} | {rate:.0f}/s | {tree} | {fmt(pct([r['p50'] for r in rs], 0.5))} "
                    f"| {fmt(pct([r['p99'] for r in rs], 0.5))} | {pct([r['success'] for r in rs], 0.5) * 100:.1f} % "
                    f"| {fmt(cpu)} | {cpu / base_cpu:.2f}x | {every(rs)} |"
                )
    if capacity:
        print(
            f"\n5x rows: {5 * capacity:.0f}/s offered (5x the given capacity of {capacity:.0f}/s)\n"
            "\n| tree | goodput of capacity (median) | every round | refused p50 (median) | every round "
            "| gateway core busy | load generator late p99 |\n|---|---|---|---|---|---|---|"
        )
        for tree in trees:
            rs = got[(tree, "5x", 5 * capacity)]
            shares = [r["rps"] / capacity for r in rs]
            print(
                f"| {tree} | {pct(shares, 0.5):.2f} | {' / '.join(f'{s:.2f}' for s in shares)} "
                f"| {fmt(pct([r['refused_p50'] for r in rs], 0.5))} "
                f"| {' / '.join(fmt(r['refused_p50'], '', 1) for r in rs)} "
                f"| {' / '.join(fmt(r['core_busy'] * 100, ' %', 0) for r in rs)} "
                f"| {' / '.join(fmt(r['late_p99'], '', 1) for r in rs)} |"
            )


def every(rows: list[dict[str, Any]]) -> str:
    return " ".join(f"{r['cpu_ms']:.2f}" for r in rows)


async def redis_usec(url: str) -> int:
    """Redis's own time in scripts and commands so far (commandstats, top-level calls only)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    # A script's own commands are counted in its EVALSHA and again alone: the scripts only.
    return sum(int(v["usec"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


if __name__ == "__main__":
    main()
