"""Latency objectives in time: a lane's TTFT and inter-token (TPOT) targets, and the tighter
TTFT target one request may ask for within its tenant's grant.

A lane's `queue_timeout_s` stays its hard bound (a request is refused past it); the targets
are what the lane aims for, judged on every finished request (metrics.py counts met / total)
and carried on the Call for the decisions that read them (admission by predicted TTFT). The
request's target is the lane's, tightened by its X-Laneway-TTFT-Target-Ms header no further
than the tenant's `min_ttft_target_ms`, the way `priority_floor` clamps X-Laneway-Priority: a
tenant without that grant cannot tighten its lanes' targets at all."""

from __future__ import annotations

from laneway.core.policy import LanePolicy
from laneway.types import TenantSnapshot

# A day: the queue timeout's own bound (admin/policies.py), so no target is beyond every lane's.
MAX_TTFT_TARGET_MS = 86_400_000
# A minute per token: past it a stream is not being served, whatever the target says.
MAX_TPOT_TARGET_MS = 60_000


def request_ttft_target_ms(lane: LanePolicy, tenant: TenantSnapshot, asked: float | None) -> float | None:
    """The request's TTFT target in ms: the lane's, or what the request asked for where that is
    tighter and the tenant's grant allows it (clamped to the grant); never past the lane's hard
    bound. None: no target (a lane without one, and nothing granted asked)."""
    granted = None if asked is None or tenant.min_ttft_target_ms is None else max(asked, tenant.min_ttft_target_ms)
    targets = [t for t in (lane.ttft_target_ms, granted) if t is not None]
    if not targets:
        return None
    return float(min(*targets, lane.queue_timeout_s * 1000))
