"""The Grafana dashboard (docker/grafana/dashboards/) asks only for what laneway exports.

A gateway with the packaged lanes serves a few requests that touch every panel (two replicas
of one alias, so routing decides; a looping answer, so an early stop is counted; a tenant at
its rate limit; a bad key), and its /metrics is scraped. The dashboard JSON is read as JSON,
every PromQL expression in it (panel targets and the lane variable) is tokenized, and each
metric selector must name a series the gateway exported, with the labels its matchers use
(and the literal values they ask for). Where Prometheus's promtool is installed, it parses
every expression too."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from laneway.app import create_app
from laneway.bootstrap import POLICIES_DIR
from laneway.settings import Settings
from prometheus_client.parser import text_string_to_metric_families
from standins.looping_engine import LOOPING
from support import Gateway, sim_model, start_gateway, unavailable
from support.engine_kinds import registered_kind

DASHBOARDS = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "dashboards"
_TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<string>"(?:[^"\\]|\\.)*")|(?P<range>\[[^\]]+\])|(?P<number>\d+(?:\.\d+)?)|"""
    r"""(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<punct>=~|!~|!=|[(){},=/*+-])"""
)
# Words that are not metric names, and those followed by a list of label names.
_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
_AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_VARIABLE = re.compile(r"^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$")


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        assert m is not None, f"cannot read {expr[pos:]!r} in {expr!r}"
        if m.lastgroup != "ws":
            out.append((m.lastgroup or "", m.group()))
        pos = m.end()
    return out


def selectors(expr: str, grouped: set[str] | None = None) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The metric selectors of a PromQL expression: (metric, [(label, op, value)]); the label
    names it groups or matches by (by, without, on, ignoring...) are added to `grouped`."""
    toks, found, i, depth = tokens(expr), [], 0, 0
    grouped = set() if grouped is None else grouped
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if text in "()":
            depth += 1 if text == "(" else -1
        elif kind == "ident" and text in _LABEL_LISTS:
            assert nxt == "(", expr
            end = next(j for j in range(i, len(toks)) if toks[j][1] == ")")
            grouped.update(t for k, t in toks[i + 2 : end] if k == "ident")
            i = end
        elif kind == "ident" and (nxt == "(" or text in _KEYWORDS or text in _AGGREGATIONS):
            pass  # a function, an aggregation (its modifier may come first), an operator
        elif kind == "ident":
            matchers: list[tuple[str, str, str]] = []
            if nxt == "{":
                i += 2
                while toks[i][1] != "}":
                    (_, label), (_, op), (skind, value) = toks[i : i + 3]
                    assert skind == "string" and op in ("=", "!=", "=~", "!~"), expr
                    matchers.append((label, op, json.loads(value)))
                    i += 3
                    if toks[i][1] == ",":
                        i += 1
            found.append((text, matchers))
        else:
            assert kind in ("number", "range", "punct"), (kind, text, expr)
        i += 1
    assert depth == 0, f"unbalanced parentheses: {expr!r}"
    return found


def expressions(dashboard: dict[str, Any]) -> list[str]:
    panels = [p for p in dashboard["panels"]] + [c for p in dashboard["panels"] for c in p.get("panels", [])]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict[str, str]]]]:
    """Sample name -> the label sets it was exported with, after the requests above."""
    lanes = yaml.safe_load((POLICIES_DIR / "lanes.yaml").read_text())["lanes"]
    replicas = [{**sim_model("sim")[0], "name": f"sim-{i}"} for i in range(2)]
    loop = [{"name": "loop-1", "engine_kind": "looping", "max_model_len": 4096, "config": {"loop": [" la"]}}]
    chat = {"task": "chat", "max_tokens": 64, "repetition_ngram": 2, "repetition_count": 3}
    seed_with = {
        "models": {"sim": replicas, "loop": loop},
        "lanes": lanes,
        "tenants": {"acme": {}, "slow": {"rpm": 1}},
        "tasks": [chat],
    }
    with registered_kind(LOOPING):
        gw: Gateway = start_gateway(tmp_path_factory.mktemp("dash"), seed_with=seed_with)
        try:
            with httpx.Client(base_url=gw.api_url, timeout=30) as http:

                def chat(key: str, model: str, **body: Any) -> httpx.Response:
                    return http.post(
                        "/chat/completions",
                        headers={"Authorization": f"Bearer {key}"},
                        json={"model": model, "max_tokens": 4, **body},
                    )

                prompt = [{"role": "user", "content": "The same long opening for every request. " * 20}]
                for stream in (False, True, False, True):
                    assert chat(gw.keys["acme"], "sim", messages=prompt, stream=stream).status_code == 200
                looped = chat(gw.keys["acme"], "loop", messages=prompt, max_tokens=64).json()
                assert looped["choices"][0]["finish_reason"] == "stop", looped
                statuses = [chat(gw.keys["slow"], "sim", messages=prompt).status_code for _ in range(2)]
                assert statuses == [200, 429]
                assert chat("lw-not-a-key", "sim", messages=prompt).status_code == 401
            text = httpx.get(gw.base_url + "/metrics", timeout=30).text
        finally:
            gw.stop()
    series: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(sample.labels)
    yield series


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.name)
def test_every_expression_names_series_laneway_exports(path: Path, scraped: dict[str, list[dict[str, str]]]) -> None:
    dashboard = json.loads(path.read_text())
    exprs = expressions(dashboard)
    assert len(exprs) >= 10
    for expr in exprs:
        grouped: set[str] = set()
        found = selectors(expr, grouped)
        assert found, f"no metric in {expr!r}"
        for label in grouped:  # every label it groups by is on the series it reads
            assert any(label in s for metric, _ in found for s in scraped.get(metric, [])), (label, expr)
        for metric, matchers in found:
            assert metric in scraped, f"{metric} (in {expr!r}) is not exported; exported: {sorted(scraped)}"
            for label, op, value in matchers:
                assert any(label in s for s in scraped[metric]), f"{metric} has no label {label!r} ({expr!r})"
                if op == "=" and "$" not in value:
                    assert any(s.get(label) == value for s in scraped[metric]), (metric, label, value)
    for variable in dashboard["templating"]["list"]:
        m = _VARIABLE.match(variable["query"]["query"])
        assert m is not None, variable
        assert any(m[2] in s for s in scraped.get(m[1], [])), f"{m[1]} has no label {m[2]!r}"


def test_the_dashboard_shows_the_lane_figures_and_the_replicas() -> None:
    dashboard = json.loads((DASHBOARDS / "laneway.json").read_text())
    names = {metric for expr in expressions(dashboard) for metric, _ in selectors(expr)}
    assert {
        "laneway_time_to_first_token_seconds_bucket",
        "laneway_queue_wait_seconds_bucket",
        "laneway_prefill_seconds_bucket",
        "laneway_decode_seconds_bucket",
        "laneway_time_per_output_token_seconds_bucket",
        "laneway_rejections_total",
        "laneway_prompt_tokens_total",
        "laneway_completion_tokens_total",
        "laneway_routing_decisions_total",
        "laneway_routing_prefix_tokens_total",
        "laneway_decode_tokens_saved_total",
    } <= names
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    assert any(r.get("repeat") == "lane" for r in rows)  # one row of panels per lane


def test_promtool_parses_every_expression(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        unavailable(
            "promtool (Debian's prometheus) is not installed",
            "promtool is not installed (CI=true: .ci/run installs Debian's prometheus)",
        )
    exprs = [e for path in sorted(DASHBOARDS.glob("*.json")) for e in expressions(json.loads(path.read_text()))]
    # Grafana's variables as Prometheus would get them.
    rules = [
        {"record": f"laneway:check{i}", "expr": e.replace("$__rate_interval", "1m").replace("$lane", "standard")}
        for i, e in enumerate(exprs)
    ]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_runs_prometheus_on_the_gateway_and_grafana_with_the_dashboards() -> None:
    docker = DASHBOARDS.parents[1]
    services = yaml.safe_load((docker / "compose.yaml").read_text())["services"]

    def mounts(service: str) -> dict[str, Path]:
        """Container path -> the file or folder of this repository mounted there."""
        out = {}
        for volume in services[service]["volumes"]:
            source, _, target = volume.partition(":")
            if source.startswith("."):
                out[target.split(":")[0]] = (docker / source).resolve()
        return out

    prom = mounts("prometheus")
    config = yaml.safe_load(prom["/etc/prometheus/prometheus.yml"].read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and "/metrics" in served_metrics_paths()
    assert job["static_configs"][0]["targets"] == [f"gateway:{Settings().port}"] and "gateway" in services

    grafana = mounts("grafana")
    provisioning, dashboards = grafana["/etc/grafana/provisioning"], grafana["/var/lib/grafana/dashboards"]
    assert dashboards == DASHBOARDS
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "laneway.yaml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    for path in DASHBOARDS.glob("*.json"):  # every panel reads the provisioned data source
        dashboard = json.loads(path.read_text())
        uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
        assert uids == {source["uid"]}, (path.name, uids)


def served_metrics_paths() -> set[str]:
    with tempfile.TemporaryDirectory() as data:
        app = create_app(Settings(data_dir=Path(data), bootstrap_demo=False))
        return {route.path for route in app.routes}
