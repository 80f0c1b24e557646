"""Render panels of the Grafana dashboard from a live Prometheus into a PNG, where Grafana
itself cannot run (no Docker engine, and no Grafana package, on the project's machines).

It serves a gateway in-process (the packaged lanes, two sim replicas of one alias, a tenant
with a low rate limit), starts Prometheus (`prometheus` on PATH: Debian's package) scraping
its /metrics every second, sends traffic for --seconds (interactive streams, standard and
batch requests, some refused), then asks Prometheus for each chosen panel's own queries
(read from the dashboard JSON, Grafana's variables filled in: $__rate_interval, $lane) over
the run, and draws them with matplotlib, one subplot a panel and a line a series.

Run: PYTHONPATH=platform .venv/bin/python docker/grafana/render_panels.py --out docs/images/dashboard.png
(matplotlib must be importable: it is not a laneway dependency.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's seeding helper and server factory

from laneway.bootstrap import POLICIES_DIR  # noqa: E402
from support import free_port, sim_model, start_gateway  # noqa: E402

DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "laneway.json"
PANELS = ("TTFT", "Tokens in and out", "Refusals by reason", "Estimated prefix hit rate by replica")
RATE_INTERVAL = "15s"


def panel_queries(title: str, lane: str) -> list[tuple[str, str]]:
    """(PromQL, legend) of the dashboard panel titled `title`, for `lane`."""
    dashboard = json.loads(DASHBOARD.read_text())
    panel = next(p for p in dashboard["panels"] if p.get("title") == title)
    out = []
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL).replace("$lane", lane)
        out.append((expr, target["legendFormat"]))
    return out


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template)


async def traffic(base: str, keys: dict[str, str], seconds: float) -> None:
    """Requests of each lane's kind until `seconds` have passed."""
    opening = "You are a helpful assistant for a shop that sells bicycles and their parts. " * 8
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base + "/v1", timeout=60) as http:

        async def user(n: int) -> None:
            i = 0
            while time.monotonic() < end:
                i += 1
                kind = (n + i) % 5
                key = keys["slow"] if kind == 4 else keys["acme"]
                body: dict[str, Any] = {
                    "model": "sim",
                    "messages": [{"role": "system", "content": opening}, {"role": "user", "content": f"question {i}"}],
                    "max_tokens": 24 if kind != 3 else 96,
                    "stream": kind in (0, 1, 4),  # 4: the limited tenant's, refused in the interactive lane
                }
                headers = {"Authorization": f"Bearer {key}"}
                if kind == 3:
                    headers["X-Laneway-Task"] = "batch"
                if kind == 2:  # a long prompt: the standard lane
                    body["messages"][1]["content"] = "details " * 600
                await http.post("/chat/completions", json=body, headers=headers)
                await asyncio.sleep(0.05)

        await asyncio.gather(*(user(n) for n in range(6)))


def query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    r = httpx.get(prom + "/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": 2})
    r.raise_for_status()
    return r.json()["data"]["result"]  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--lane", default="interactive", help="the lane the per-lane panels show")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("matplotlib is not installed: nothing can be drawn (pip install matplotlib)") from None
    if shutil.which("prometheus") is None:
        raise SystemExit("prometheus is not on PATH (apt-get install prometheus)")

    lanes = yaml.safe_load((POLICIES_DIR / "lanes.yaml").read_text())["lanes"]
    replicas = [{**sim_model("sim", decode_ms_base=8.0, prefill_ms_per_token=0.02, max_concurrency=4)[0],
                 "name": f"sim-{i}"} for i in range(2)]  # fmt: skip
    seed_with = {"models": {"sim": replicas}, "lanes": lanes, "tenants": {"acme": {}, "slow": {"rpm": 30}}}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        gw = start_gateway(data, seed_with=seed_with)
        port = free_port()
        job = {"job_name": "laneway", "static_configs": [{"targets": [f"127.0.0.1:{gw.port}"]}]}
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}
        (data / "prometheus.yml").write_text(yaml.safe_dump(config))
        command = ["prometheus", f"--config.file={data / 'prometheus.yml'}", f"--storage.tsdb.path={data / 'tsdb'}",
                   f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
        prom = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        prom_url = f"http://127.0.0.1:{port}"
        try:
            start = time.time()
            asyncio.run(traffic(gw.base_url, gw.keys, args.seconds))
            time.sleep(3)  # the last scrape
            end = time.time()
            fig, axes = plt.subplots(2, 2, figsize=(13, 7.5))
            for ax, title in zip(axes.flat, PANELS, strict=True):
                for expr, template in panel_queries(title, args.lane):
                    for series in query_range(prom_url, expr, start, end):
                        points = [(float(t) - start, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf")]
                        if points:
                            ax.plot(*zip(*points, strict=True), label=legend(template, series["metric"]) or template)
                lane_note = f" (lane {args.lane})" if "$lane" in json.dumps(panel_queries(title, "$lane")) else ""
                ax.set_title(title + lane_note, fontsize=10)
                ax.set_xlabel("seconds", fontsize=8)
                ax.tick_params(labelsize=8)
                if ax.lines:
                    ax.legend(fontsize=7, loc="upper left")
                ax.grid(alpha=0.3)
            fig.suptitle("laneway: lanes and replicas (docker/grafana/dashboards/laneway.json), from a live Prometheus",
                         fontsize=11)  # fmt: skip
            fig.tight_layout()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(args.out, dpi=90)
            print(f"wrote {args.out}")
        finally:
            prom.terminate()
            prom.wait(10)
            gw.stop()


if __name__ == "__main__":
    main()
