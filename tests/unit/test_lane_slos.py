"""SLOs per lane (issue 38): the X-Laneway-TTFT-Target-Ms header checked at the edge, clamped by
the tenant's grant as X-Laneway-Priority is by its floor, the request's target carried on the
Call and its Outcome, and attainment counted once per finished request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from laneway.admin.policies import LaneIn
from laneway.admin.validation import convert
from laneway.api.ttft_target import HEADER, ttft_target_ms
from laneway.bootstrap import POLICIES_DIR
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Gateway, GenerationIntent, Outcome
from laneway.core.pipeline.config import GatewayConfig
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore
from laneway.core.slo import request_ttft_target_ms
from laneway.db.repositories import DeploymentSpec
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics
from laneway.types import TenantSnapshot

INTERACTIVE = LanePolicy(
    name="interactive", match_stream=True, queue_timeout_s=2.0, ttft_target_ms=1000, tpot_target_ms=100
)
UNTARGETED = LanePolicy(name="standard", queue_timeout_s=30.0)
PLAIN = TenantSnapshot(id=1, name="plain", api_key_id=1)
GRANTED = TenantSnapshot(id=2, name="granted", api_key_id=2, min_ttft_target_ms=200)


@pytest.mark.parametrize("raw", ["-5", "0", "0.0", "NaN", "nan", "inf", "-inf", "1e3", "abc", "1_000", "9" * 400])
def test_a_bad_header_is_400_naming_it(raw: str) -> None:
    with pytest.raises(GatewayError) as info:
        ttft_target_ms({HEADER.lower(): raw}, {})
    assert (info.value.status, info.value.param) == (400, HEADER)
    assert HEADER in info.value.message


def test_a_huge_target_is_400_and_metadata_is_named_as_metadata() -> None:
    with pytest.raises(GatewayError) as info:
        ttft_target_ms({HEADER.lower(): "86400001"}, {})
    assert info.value.param == HEADER and "at most 86400000" in info.value.message
    with pytest.raises(GatewayError) as info:
        ttft_target_ms({}, {"laneway_ttft_target_ms": "soon"})
    assert info.value.param == "metadata.laneway_ttft_target_ms"


def test_a_sane_header_is_read_and_wins_over_metadata() -> None:
    assert ttft_target_ms({HEADER.lower(): " 250.5 "}, {}) == 250.5
    assert ttft_target_ms({HEADER.lower(): "300"}, {"laneway_ttft_target_ms": "900"}) == 300
    assert ttft_target_ms({}, {"laneway_ttft_target_ms": "900"}) == 900
    assert ttft_target_ms({HEADER.lower(): ""}, {}) is None  # empty is none, as for X-Laneway-Priority
    assert ttft_target_ms({}, {}) is None


def test_the_request_target_is_clamped_by_the_grant_as_priority_is_by_its_floor() -> None:
    assert request_ttft_target_ms(INTERACTIVE, PLAIN, None) == 1000  # the lane's
    assert request_ttft_target_ms(INTERACTIVE, PLAIN, 10) == 1000  # no grant: cannot tighten
    assert request_ttft_target_ms(INTERACTIVE, GRANTED, 10) == 200  # tighter than its grant: clamped
    assert request_ttft_target_ms(INTERACTIVE, GRANTED, 500) == 500  # within it
    assert request_ttft_target_ms(INTERACTIVE, GRANTED, 5000) == 1000  # looser than the lane's: the lane's
    assert request_ttft_target_ms(UNTARGETED, PLAIN, 500) is None  # nothing granted, no lane target
    assert request_ttft_target_ms(UNTARGETED, GRANTED, 500) == 500
    assert request_ttft_target_ms(UNTARGETED, GRANTED, 60_000) == 30_000  # never past the hard bound


def outcome(**fields: Any) -> Outcome:
    base: dict[str, Any] = {
        "request_id": "r",
        "tenant_id": 1,
        "tenant_name": "plain",
        "api_key_id": 1,
        "model": "chat",
        "asked_model": "chat",
        "deployment": "chat-sim",
        "engine": "sim",
        "quantization": "sim",
        "gpu_type": "sim",
        "lane": "interactive",
        "endpoint": "chat",
        "stream": True,
        "end_user": None,
        "status": 200,
        "finish_reason": "stop",
        "error_code": None,
        "prompt_tokens": 10,
        "completion_tokens": 11,
        "started": 100.0,
        "dispatched_at": 100.1,
        "first_token_at": 100.5,  # TTFT 500 ms
        "ended": 101.5,  # 10 tokens after the first in 1 s: TPOT 100 ms
        "ttft_target_ms": 1000.0,
        "tpot_target_ms": 100.0,
    }
    return Outcome(**{**base, **fields})


def test_what_each_finished_request_is_judged_on() -> None:
    assert outcome().slos_met() == (("ttft", True), ("tpot", True))
    assert outcome(ttft_target_ms=499.0, tpot_target_ms=99.0).slos_met() == (("ttft", False), ("tpot", False))
    assert outcome(completion_tokens=1).slos_met() == (("ttft", True),)  # one token: no pace to judge
    assert outcome(ttft_target_ms=None, tpot_target_ms=None).slos_met() == ()  # a lane without targets
    failed = {"first_token_at": None, "completion_tokens": 0}
    assert outcome(**failed, status=503, error_code="queue_timeout").slos_met() == (("ttft", False),)
    assert outcome(**failed, status=499, error_code="client_closed").slos_met() == ()  # the client left
    assert outcome(**failed, status=429, error_code="rate_limit_exceeded").slos_met() == ()  # its own limit
    assert outcome(endpoint="embeddings").slos_met() == ()


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_attainment_is_counted_once_per_request_by_lane_slo_and_alias() -> None:
    metrics = GatewayMetrics()
    for o in (
        outcome(),
        outcome(ttft_target_ms=100.0),
        outcome(model="other"),
        outcome(lane="standard", ttft_target_ms=None, tpot_target_ms=None),
    ):
        metrics.finished(o)
    ttft = {"lane": "interactive", "slo": "ttft", "alias": "chat"}
    assert (sample(metrics, "laneway_slo_met_total", **ttft), sample(metrics, "laneway_slo_total", **ttft)) == (1, 2)
    tpot = {**ttft, "slo": "tpot"}
    assert (sample(metrics, "laneway_slo_met_total", **tpot), sample(metrics, "laneway_slo_total", **tpot)) == (2, 2)
    other = {**ttft, "alias": "other"}
    assert sample(metrics, "laneway_slo_total", **other) == 1
    assert sample(metrics, "laneway_slo_total", lane="standard", slo="ttft", alias="chat") == 0
    missed_only = GatewayMetrics()
    missed_only.finished(outcome(ttft_target_ms=1.0, tpot_target_ms=None))
    text = missed_only.exposition().decode()
    assert 'laneway_slo_met_total{alias="chat",lane="interactive",slo="ttft"} 0.0' in text  # 0, not absent


def test_the_tenant_label_follows_the_metrics_rule() -> None:
    """Tenants only where LANEWAY_METRICS_TENANT_LABEL is on, as on every other metric."""
    metrics = GatewayMetrics(tenant_label=True)
    metrics.finished(outcome())
    labels = {"lane": "interactive", "slo": "ttft", "alias": "chat", "tenant": "plain"}
    assert sample(metrics, "laneway_slo_total", **labels) == 1


class Recorded:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def finished(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


async def test_the_request_target_rides_on_the_call_and_its_outcome() -> None:
    registry = EngineRegistry()
    spec = DeploymentSpec(1, "chat-sim", "chat", "sim", {"decode_ms_base": 0.1}, "q", "sim", 256)
    await registry.load([spec])
    sink = Recorded()
    policies = PolicyStore(None, PolicySnapshot(lanes=(INTERACTIVE, UNTARGETED)))
    gw = Gateway(registry, policies, sinks=[sink], config=GatewayConfig(default_max_tokens=8))  # type: ignore[list-item]
    try:
        for tenant, asked in ((GRANTED, 10.0), (PLAIN, 10.0), (GRANTED, None)):
            intent = GenerationIntent(endpoint="chat", alias="chat", stream=True, prompt="x", ttft_target_ms=asked)
            call = await gw.prepare(tenant, intent)
            assert call.lane.name == "interactive"
            lease = await gw.admit(call)
            try:
                [d async for d in gw.run(lease)]
            finally:
                lease.release()
        assert [(o.ttft_target_ms, o.tpot_target_ms) for o in sink.outcomes] == [
            (200, 100),
            (1000, 100),
            (1000, 100),
        ]
        untargeted = await gw.prepare(
            GRANTED, GenerationIntent(endpoint="chat", alias="chat", stream=False, prompt="x")
        )
        assert untargeted.lane.name == "standard" and untargeted.ttft_target_ms is None
    finally:
        await registry.close()


def test_the_shipped_lanes_have_targets_the_admin_api_would_accept() -> None:
    lanes = yaml.safe_load(Path(str(POLICIES_DIR / "lanes.yaml")).read_text())["lanes"]
    by_name = {lane["name"]: lane for lane in lanes}
    for lane in lanes:
        convert({k: v for k, v in lane.items() if k != "name"}, LaneIn)
        if lane.get("ttft_target_ms") is not None:
            assert lane["ttft_target_ms"] <= lane["queue_timeout_s"] * 1000, lane["name"]
    assert (by_name["interactive"]["ttft_target_ms"], by_name["interactive"]["tpot_target_ms"]) == (1000, 100)
    assert "ttft_target_ms" not in by_name["batch"]  # throughput work: no latency target
