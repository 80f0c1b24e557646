"""Admission control: refuse at the door (503 + Retry-After) what the lane cannot serve in
time, and refuse it fairly: the same way the queue serves.

Refusing early is kinder than a timeout later: the client learns at once, keeps its budget
for a retry, and the requests already queued keep their place and their SLA.

Fair, because a flood must not get everyone refused. A lane's depth limit is shared by the
tenants queued in it, by weight: a tenant over its share while others are waiting is refused
(`tenant_queue_share`); a tenant under its share is admitted while the lane has room, and
when it has none, the newest request of the tenant furthest over its share makes way for it.
The predicted wait is computed from the newcomer's place in the fair order (what weighted
round robin would give it), not from the lane's total depth: a tenant with nothing queued is
served within a round whatever the flood behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.policy import LanePolicy


class QueueView(Protocol):
    """What admission reads of a deployment's queue (core/scheduler.py's DeploymentScheduler)."""

    def depth(self, lane: str) -> int: ...
    def tenant_depth(self, lane: str, tenant_id: int) -> int: ...
    def queued_weights(self, lane: str) -> dict[int, float]: ...
    def evict_newest(self, lane: str, tenant_id: int, error: Callable[[], BaseException]) -> bool: ...
    def predicted_wait(self, lane: LanePolicy, tenant_id: int | None = None, weight: float = 1.0) -> float: ...


def queue_full(lane: LanePolicy, depth: int) -> GatewayError:
    return GatewayError(
        ErrorCode.QUEUE_FULL,
        f"The '{lane.name}' lane is full ({depth} requests waiting). Retry later.",
        retry_after=lane.retry_after_s,
    )


def wait_too_long(lane: LanePolicy, wait: float) -> GatewayError:
    return GatewayError(
        ErrorCode.PREDICTED_WAIT_EXCEEDED,
        f"The '{lane.name}' lane would keep this request waiting about {wait:.1f} s, beyond its "
        f"{lane.queue_timeout_s:g} s limit. Retry later.",
        retry_after=max(lane.retry_after_s, wait - lane.queue_timeout_s),
    )


def over_share(lane: LanePolicy, depth: int, share: float) -> GatewayError:
    return GatewayError(
        ErrorCode.TENANT_QUEUE_SHARE,
        f"Your requests already fill your share of the '{lane.name}' lane ({depth} waiting, share {share:.0f}) "
        "while other tenants wait. Retry later.",
        retry_after=lane.retry_after_s,
    )


def admit(scheduler: QueueView, lane: LanePolicy, tenant_id: int = 0, weight: float = 1.0) -> None:
    weights = scheduler.queued_weights(lane.name)
    weights[tenant_id] = max(weight, 0.01)
    total_weight = sum(weights.values())
    share = max(1.0, lane.max_queue_depth * weights[tenant_id] / total_weight)
    mine = scheduler.tenant_depth(lane.name, tenant_id)
    depth = scheduler.depth(lane.name)
    contended = len(weights) > 1
    if contended and mine >= share:
        raise over_share(lane, mine, share)
    if depth >= lane.max_queue_depth:
        if not contended:
            raise queue_full(lane, depth)

        # Full, and this tenant is under its share: the tenant furthest over its share makes way.
        def excess(tid: int) -> float:
            return scheduler.tenant_depth(lane.name, tid) - lane.max_queue_depth * weights[tid] / total_weight

        hog = max((tid for tid in weights if tid != tenant_id), key=excess)
        hog_depth = scheduler.tenant_depth(lane.name, hog)
        scheduler.evict_newest(
            lane.name, hog, lambda: over_share(lane, hog_depth, lane.max_queue_depth * weights[hog] / total_weight)
        )
    wait = scheduler.predicted_wait(lane, tenant_id, weight)
    if wait > lane.queue_timeout_s:
        raise wait_too_long(lane, wait)
