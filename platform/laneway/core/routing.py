"""LaneRouter: which lane a request joins, from its shape and what the client asked for."""

from __future__ import annotations

from laneway.contracts.errors import invalid_request
from laneway.core.policy import DEFAULT_LANE, LanePolicy, PolicySnapshot


class LaneRouter:
    def route(
        self,
        snapshot: PolicySnapshot,
        *,
        prompt_tokens: int,
        stream: bool,
        task: str | None,
        explicit_lane: str | None = None,
    ) -> LanePolicy:
        """An explicit lane wins (and must exist); otherwise the first lane whose rule matches;
        otherwise the last lane (the catch-all); with no lanes configured, one default lane."""
        if explicit_lane:
            lane = snapshot.lane(explicit_lane)
            if lane is None:
                known = ", ".join(x.name for x in snapshot.lanes) or "none"
                raise invalid_request(f"Unknown lane '{explicit_lane}' (known: {known}).", param="X-Laneway-Lane")
            return lane
        for lane in snapshot.lanes:
            if lane.matches(prompt_tokens=prompt_tokens, stream=stream, task=task):
                return lane
        return snapshot.lanes[-1] if snapshot.lanes else DEFAULT_LANE
