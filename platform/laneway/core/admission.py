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

In seconds, where the replicas' latency models are warm (an `Outlook`, core/latency/outlook.py):
the request's predicted time to first token from that place (the wait for a slot, played out
from the running requests' ages and the replicas' learned holds, plus the TTFT from that slot)
is held against the lane's hard bound, `queue_timeout_s`, and a request that cannot meet it
even on the low end of the prediction is refused at once, Retry-After the seconds until it
could. Only while every replica's model is trusted (warm, and recently right: `refuses`); else
the wait is counted in queue places as below. Every refusal here then
says when waiting cures it: a queue place frees in one slot's time; a tenant over its share
gets a place once its excess is served at its share of the rate. While any replica is cold the
wait is counted in queue places and the lane's mean hold (DeploymentScheduler.predicted_wait)
and Retry-After is the lane's `retry_after_s`, as before the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.latency.outlook import Outlook as Outlook  # re-exported: the schedulers' admit() names it
from laneway.core.policy import LanePolicy


class QueueView(Protocol):
    """What admission reads of a deployment's queue (core/scheduler.py's DeploymentScheduler)."""

    def depth(self, lane: str) -> int: ...
    def tenant_depth(self, lane: str, tenant_id: int) -> int: ...
    def queued_weights(self, lane: str) -> dict[int, float]: ...
    def evict_newest(self, lane: str, tenant_id: int, error: Callable[[], BaseException]) -> bool: ...
    def predicted_wait(self, lane: LanePolicy, tenant_id: int | None = None, weight: float = 1.0) -> float: ...
    def ahead_of(self, lane: LanePolicy, tenant_id: int | None = None, weight: float = 1.0) -> int: ...


def queue_timeout(lane: LanePolicy, waited_s: float) -> GatewayError:
    return GatewayError(
        ErrorCode.QUEUE_TIMEOUT,
        f"The '{lane.name}' lane is saturated: no engine slot within {waited_s:.1f} s. Retry later.",
        retry_after=lane.retry_after_s,
    )


def queue_full(lane: LanePolicy, depth: int, outlook: Outlook | None = None) -> GatewayError:
    return GatewayError(
        ErrorCode.QUEUE_FULL,
        f"The '{lane.name}' lane is full ({depth} requests waiting). Retry later.",
        retry_after=lane.retry_after_s if outlook is None else outlook.seconds_for(1),
    )


def wait_too_long(lane: LanePolicy, wait: float) -> GatewayError:
    return GatewayError(
        ErrorCode.PREDICTED_WAIT_EXCEEDED,
        f"The '{lane.name}' lane would keep this request waiting about {wait:.1f} s, beyond its "
        f"{lane.queue_timeout_s:g} s limit. Retry later.",
        retry_after=max(lane.retry_after_s, wait - lane.queue_timeout_s),
    )


def ttft_too_long(lane: LanePolicy, ttft: float) -> GatewayError:
    """Refused at once: its predicted first token is past the lane's bound. Retry-After: the
    seconds until the same prediction would meet it (the queue ahead drained by that much)."""
    return GatewayError(
        ErrorCode.PREDICTED_WAIT_EXCEEDED,
        f"The '{lane.name}' lane's first token for this request is predicted in about {ttft:.1f} s, beyond its "
        f"{lane.queue_timeout_s:g} s limit. Retry later.",
        retry_after=ttft - lane.queue_timeout_s,
    )


def over_share(
    lane: LanePolicy, depth: int, share: float, outlook: Outlook | None = None, weight_share: float = 1.0
) -> GatewayError:
    # With the model: its excess (and one) served at its weight's share of the replicas' rate.
    retry = lane.retry_after_s if outlook is None else outlook.seconds_for((depth - share + 1) / weight_share)
    return GatewayError(
        ErrorCode.TENANT_QUEUE_SHARE,
        f"Your requests already fill your share of the '{lane.name}' lane ({depth} waiting, share {share:.0f}) "
        "while other tenants wait. Retry later.",
        retry_after=retry,
    )


def admit(
    scheduler: QueueView, lane: LanePolicy, tenant_id: int = 0, weight: float = 1.0, outlook: Outlook | None = None
) -> None:
    weights = scheduler.queued_weights(lane.name)
    weights[tenant_id] = max(weight, 0.01)
    total_weight = sum(weights.values())
    share = max(1.0, lane.max_queue_depth * weights[tenant_id] / total_weight)
    mine = scheduler.tenant_depth(lane.name, tenant_id)
    depth = scheduler.depth(lane.name)
    contended = len(weights) > 1
    if contended and mine >= share:
        raise over_share(lane, mine, share, outlook, weights[tenant_id] / total_weight)
    if depth >= lane.max_queue_depth:
        if not contended:
            raise queue_full(lane, depth, outlook)

        # Full, and this tenant is under its share: the tenant furthest over its share makes way.
        def excess(tid: int) -> float:
            return scheduler.tenant_depth(lane.name, tid) - lane.max_queue_depth * weights[tid] / total_weight

        hog = max((tid for tid in weights if tid != tenant_id), key=excess)
        hog_depth = scheduler.tenant_depth(lane.name, hog)
        scheduler.evict_newest(
            lane.name,
            hog,
            lambda: over_share(
                lane,
                hog_depth,
                lane.max_queue_depth * weights[hog] / total_weight,
                outlook,
                weights[hog] / total_weight,
            ),
        )
    if outlook is not None and outlook.refuses:  # in seconds: its place in the fair order, the learned speed
        ahead = scheduler.ahead_of(lane, tenant_id, weight)
        # Refused only on the low end of the prediction (its TTFT from a slot less the model's
        # recent error): a refusal that waiting would have cured is worse than a wait.
        if outlook.ttft(ahead, low=True) > lane.queue_timeout_s:  # before refusing: what a cache saves
            cached = outlook.with_cache() or outlook
            if cached.ttft(ahead, low=True) > lane.queue_timeout_s:
                raise ttft_too_long(lane, cached.ttft(ahead))
        return
    wait = scheduler.predicted_wait(lane, tenant_id, weight)
    if wait > lane.queue_timeout_s:
        raise wait_too_long(lane, wait)
