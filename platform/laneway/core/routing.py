"""LaneRouter: which lane a request joins, from its shape and what the client asked for."""

from __future__ import annotations

from laneway.contracts.errors import invalid_request
from laneway.core.policy import BACKGROUND_LANE, DEFAULT_LANE, LanePolicy, PolicySnapshot


class LaneRouter:
    def route(
        self,
        snapshot: PolicySnapshot,
        *,
        prompt_tokens: int,
        stream: bool,
        task: str | None,
        explicit_lane: str | None = None,
        background: bool = False,
    ) -> LanePolicy:
        """A batch line (background) goes to the first background lane, else the lane named
        "batch", else a built-in background lane. Otherwise an explicit lane wins (and must
        exist); else the first lane whose rule matches; else the last lane (the catch-all);
        with no lanes configured, one default lane."""
        if background:
            idle = [x for x in snapshot.lanes if x.background]
            return idle[0] if idle else snapshot.lane("batch") or BACKGROUND_LANE
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
