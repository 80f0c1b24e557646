"""What the scorers see of one replica, measured once per placement."""

from __future__ import annotations

from dataclasses import dataclass

from laneway.engines.registry import LiveDeployment


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    load: float  # 0 idle, 1 every slot busy, above 1 a queue (see LoadScorer.load_of)
    cached_share: float  # of the prompt's blocks, the share this replica most likely holds
    session: bool  # it served the request's prompt_cache_key last
    # Seconds to the request's first token placed here now (its queue, then its prefill of what
    # it does not hold), from the replica's latency model; None while that model is cold.
    predicted_ttft_s: float | None
    # The replica itself, for a scorer that reads what the fields above do not carry (its
    # spec, its engine's info).
    replica: LiveDeployment
