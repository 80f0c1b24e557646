"""Lane caps below a deployment's own sequence limit (core/lane_caps.py): found, and logged once."""

from __future__ import annotations

import logging

import pytest
from laneway.core.lane_caps import DeploymentSeats, LaneCapLog, lane_caps
from laneway.core.policy import LanePolicy

VLLM = DeploymentSeats("vllm-1", "chat", 8)
SMALL = DeploymentSeats("llama-1", "chat", 2)


def test_only_lanes_below_a_deployments_sequences_are_caps() -> None:
    lanes = (LanePolicy("interactive", max_concurrency=4), LanePolicy("standard", max_concurrency=8))
    (cap,) = lane_caps(lanes, [VLLM, SMALL])
    assert (cap.lane, cap.cap, cap.deployment, cap.sequences) == ("interactive", 4, "vllm-1", 8)
    assert "raise the lane's max_concurrency" in cap.line() and "'vllm-1' (chat)" in cap.line()
    assert lane_caps((), [DeploymentSeats("huge", "x", 128)]) == []  # no lanes: the default lane, uncapped


def test_a_lane_without_a_cap_caps_nothing_whatever_the_engine_runs() -> None:
    uncapped = LanePolicy("interactive")  # the default: the replica's learned limit is its room
    assert uncapped.max_concurrency is None and uncapped.cap > 1_000_000
    assert lane_caps((uncapped,), [VLLM, SMALL, DeploymentSeats("huge", "x", 4096)]) == []


def test_each_cap_is_logged_once_and_again_only_after_it_went_away(caplog: pytest.LogCaptureFixture) -> None:
    capped, raised = (LanePolicy("interactive", max_concurrency=4),), (LanePolicy("interactive", max_concurrency=8),)
    log = LaneCapLog()
    with caplog.at_level(logging.WARNING, logger="laneway.policy"):
        for lanes in (capped, capped, capped, raised, raised, capped):
            log.check(lanes, [VLLM])
    assert len(caplog.records) == 2 and all("interactive" in r.getMessage() for r in caplog.records)
