"""The deployment files say what the code does: names of metrics, health paths, settings."""

from pathlib import Path

import yaml
from laneway.settings import Settings

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_keda_scales_on_a_metric_laneway_exports_and_never_to_zero() -> None:
    scaled = yaml.safe_load((DOCKER / "k8s" / "keda-scaledobject.yaml").read_text())
    assert scaled["spec"]["minReplicaCount"] >= 1
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert "laneway_requests_waiting" in query
    metrics_src = (DOCKER.parent / "platform" / "laneway" / "metrics.py").read_text()
    assert '"laneway_requests_waiting"' in metrics_src


def test_compose_wires_postgres_redis_and_a_llamacpp_model() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert {"postgres", "redis", "gateway"} <= set(compose["services"])
    env = compose["services"]["gateway"]["environment"]
    assert env["LANEWAY_DATABASE_URL"].startswith("postgresql+asyncpg://")
    assert env["LANEWAY_REDIS_URL"].startswith("redis://")
    known = {f"LANEWAY_{name.upper()}" for name in Settings.__dataclass_fields__}
    assert set(env) <= known, set(env) - known


def test_probes_use_the_health_endpoints() -> None:
    docs = list(yaml.safe_load_all((DOCKER / "k8s" / "gateway.yaml").read_text()))
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"


def test_the_k8s_topology_runs_several_replicas_on_redis_with_settings_that_exist() -> None:
    docs = list(yaml.safe_load_all((DOCKER / "k8s" / "gateway.yaml").read_text()))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs if d}
    assert {("Deployment", "laneway"), ("Deployment", "redis"), ("Service", "redis")} <= kinds
    gateway = docs[0]["spec"]
    assert gateway["replicas"] >= 2
    env = {e["name"] for e in gateway["template"]["spec"]["containers"][0]["env"]}
    known = {f"LANEWAY_{name.upper()}" for name in Settings.__dataclass_fields__}
    assert {"LANEWAY_REDIS_URL", "LANEWAY_SLOT_LEASE_TTL_S"} <= env and env <= known, env - known
    drain = next(
        e for e in gateway["template"]["spec"]["containers"][0]["env"] if e["name"] == "LANEWAY_DRAIN_TIMEOUT_S"
    )
    assert gateway["template"]["spec"]["terminationGracePeriodSeconds"] > float(drain["value"])
    engines = list(yaml.safe_load_all((DOCKER / "k8s" / "engines.yaml").read_text()))
    assert any(d["kind"] == "Service" and d["metadata"]["name"] == "vllm" for d in engines)
