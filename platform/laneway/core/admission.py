"""Admission control: refuse at the door (503 + Retry-After) what the lane cannot serve in time.

Refusing early is kinder than a timeout later: the client learns at once, keeps its budget
for a retry, and the requests already queued keep their place and their SLA.
"""

from __future__ import annotations

from laneway.core.errors import GatewayError
from laneway.core.policy import LanePolicy
from laneway.core.scheduler import DeploymentScheduler


def admit(scheduler: DeploymentScheduler, lane: LanePolicy) -> None:
    depth = scheduler.depth(lane.name)
    if depth >= lane.max_queue_depth:
        raise GatewayError(
            503,
            f"The '{lane.name}' lane is full ({depth} requests waiting). Retry later.",
            code="queue_full",
            type="service_unavailable",
            retry_after=lane.retry_after_s,
        )
    wait = scheduler.predicted_wait(lane)
    if wait > lane.queue_timeout_s:
        raise GatewayError(
            503,
            f"The '{lane.name}' lane would keep this request waiting about {wait:.1f} s, beyond its "
            f"{lane.queue_timeout_s:g} s limit. Retry later.",
            code="predicted_wait_exceeded",
            type="service_unavailable",
            retry_after=max(lane.retry_after_s, wait - lane.queue_timeout_s),
        )
