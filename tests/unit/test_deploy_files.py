"""The deployment files say what the code does: the metric the autoscaler queries is one a
running gateway exports (with the labels the query selects), the probes and scrape paths are
routes the app serves, and the environment names settings that exist. Each file is parsed
(YAML, PromQL selectors) and checked against the code's own answer, never against its text."""

from __future__ import annotations

import re
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
from support import Gateway, sim_model, start_gateway

DOCKER = Path(__file__).resolve().parents[2] / "docker"
KNOWN_ENV = {f"LANEWAY_{name.upper()}" for name in Settings.__dataclass_fields__}
# A PromQL instant-vector selector: a metric name and its {label="value", ...} matchers.
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"\s*')


def selectors(query: str) -> list[tuple[str, dict[str, str]]]:
    """The metric selectors of a PromQL query, each with its equality matchers."""
    found = []
    for name, matchers in SELECTOR.findall(query):
        labels = {}
        for part in filter(str.strip, matchers.split(",")):
            m = MATCHER.fullmatch(part)
            assert m, f"not an equality matcher: {part!r} in {query!r}"
            labels[m[1]] = m[2]
        found.append((name, labels))
    return found


def served_paths() -> set[str]:
    """The paths the app routes (built, not started)."""
    with tempfile.TemporaryDirectory() as data:
        app = create_app(Settings(data_dir=Path(data), bootstrap_demo=False))
        return {route.path for route in app.routes}


@pytest.fixture(scope="module")
def scraped() -> Iterator[dict[str, Any]]:
    """/metrics of a running gateway with the packaged lanes, after one short streamed request
    (the interactive lane's kind): metric family name -> family."""
    lanes = yaml.safe_load((POLICIES_DIR / "lanes.yaml").read_text())["lanes"]
    with tempfile.TemporaryDirectory() as data:
        seed_with = {"models": {"sim": sim_model("sim")}, "lanes": lanes, "tenants": {"acme": {}}}
        gw: Gateway = start_gateway(Path(data), seed_with=seed_with)
        try:
            body = {"model": "sim", "prompt": "hi", "max_tokens": 2, "stream": True}
            r = httpx.post(
                gw.api_url + "/completions",
                headers={"Authorization": f"Bearer {gw.keys['acme']}"},
                json=body,
                timeout=30,
            )
            assert r.status_code == 200 and r.headers["x-laneway-lane"] == "interactive", r.text
            text = httpx.get(gw.base_url + "/metrics", timeout=30).text
        finally:
            gw.stop()
    yield {family.name: family for family in text_string_to_metric_families(text)}


def test_keda_scales_on_a_metric_laneway_exports_and_never_to_zero(scraped: dict[str, Any]) -> None:
    scaled = yaml.safe_load((DOCKER / "k8s" / "keda-scaledobject.yaml").read_text())
    assert scaled["spec"]["minReplicaCount"] >= 1
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    wanted = selectors(query)
    assert [name for name, _ in wanted] == ["laneway_requests_waiting"], query
    for name, labels in wanted:
        assert name in scraped and scraped[name].type == "gauge", sorted(scraped)
        series = [sample.labels for sample in scraped[name].samples]
        assert any(labels.items() <= s.items() for s in series), (query, series)


def test_compose_wires_postgres_redis_and_a_llamacpp_model() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert {"postgres", "redis", "gateway"} <= set(compose["services"])
    gateway = compose["services"]["gateway"]
    env = gateway["environment"]
    assert env["LANEWAY_DATABASE_URL"].startswith("postgresql+asyncpg://")
    assert env["LANEWAY_REDIS_URL"].startswith("redis://")
    assert set(env) <= KNOWN_ENV, set(env) - KNOWN_ENV
    # The published port is the one laneway listens on (no LANEWAY_PORT: its default).
    assert "LANEWAY_PORT" not in env
    assert [int(p.rpartition(":")[2]) for p in gateway["ports"]] == [Settings().port]


def test_probes_and_the_scrape_use_paths_the_app_serves_on_its_port() -> None:
    docs = list(yaml.safe_load_all((DOCKER / "k8s" / "gateway.yaml").read_text()))
    pod = docs[0]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    scrape = pod["metadata"]["annotations"]
    assert scrape["prometheus.io/scrape"] == "true" and scrape["prometheus.io/path"] == "/metrics"
    paths = served_paths()
    assert {"/health/ready", "/health/live", "/metrics"} <= paths
    env = {e["name"] for e in container["env"]}
    assert "LANEWAY_PORT" not in env
    assert [p["containerPort"] for p in container["ports"]] == [Settings().port]
    assert int(scrape["prometheus.io/port"]) == Settings().port


def test_the_k8s_topology_runs_several_replicas_on_redis_with_settings_that_exist() -> None:
    docs = list(yaml.safe_load_all((DOCKER / "k8s" / "gateway.yaml").read_text()))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs if d}
    assert {("Deployment", "laneway"), ("Deployment", "redis"), ("Service", "redis")} <= kinds
    gateway = docs[0]["spec"]
    assert gateway["replicas"] >= 2
    env = {e["name"] for e in gateway["template"]["spec"]["containers"][0]["env"]}
    assert {"LANEWAY_REDIS_URL", "LANEWAY_SLOT_LEASE_TTL_S"} <= env and env <= KNOWN_ENV, env - KNOWN_ENV
    drain = next(
        e for e in gateway["template"]["spec"]["containers"][0]["env"] if e["name"] == "LANEWAY_DRAIN_TIMEOUT_S"
    )
    assert gateway["template"]["spec"]["terminationGracePeriodSeconds"] > float(drain["value"])
    engines = list(yaml.safe_load_all((DOCKER / "k8s" / "engines.yaml").read_text()))
    assert any(d["kind"] == "Service" and d["metadata"]["name"] == "vllm" for d in engines)
