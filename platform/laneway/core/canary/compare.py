"""Scoring a shadow's answer against the one served for the same request, and the figures
each candidate deployment gathers (the admin's Compare view and JSON API).

- exact: the two texts are equal, judged only at temperature 0 (sampling differs by design);
- similarity: token-level, the Jaccard share of the two answers' word multisets, at
  temperature 0 too;
- JSON: for requests in a JSON mode, whether each answer parses;
- TTFT: each engine's own time to its first token (the served one from its dispatch, so
  neither side counts the queue), as a ratio.
"""

from __future__ import annotations

import json
import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

WORST_KEPT = 5  # disagreements kept per candidate to read, the least similar


def similarity(a: str, b: str) -> float:
    """Jaccard share of the two texts' word multisets: 1.0 equal, 0.0 nothing in common."""
    left, right = Counter(a.split()), Counter(b.split())
    union = sum((left | right).values())
    return 1.0 if union == 0 else sum((left & right).values()) / union


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True, slots=True)
class Pair:
    """One request answered by both: the served answer and the shadow's."""

    served: str
    shadow: str
    served_ttft_s: float | None
    shadow_ttft_s: float | None
    greedy: bool  # temperature 0: the answers should agree
    json_mode: bool
    prompt_head: str


@dataclass
class ShadowFigures:
    """What one shadow deployment's copies came to, against the served answers."""

    compared: int = 0
    failed: int = 0
    dropped: int = 0  # not run: the shadow (or the shadow lane) was busy
    greedy: int = 0
    exact: int = 0
    similarity_sum: float = 0.0
    json_asked: int = 0
    json_served_ok: int = 0
    json_shadow_ok: int = 0
    served_ttft: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    shadow_ttft: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    worst: list[tuple[float, str, str, str]] = field(default_factory=list)  # (similarity, prompt, served, shadow)

    def add(self, pair: Pair) -> None:
        self.compared += 1
        if pair.served_ttft_s is not None and pair.shadow_ttft_s is not None:
            self.served_ttft.append(pair.served_ttft_s)
            self.shadow_ttft.append(pair.shadow_ttft_s)
        if pair.json_mode:
            self.json_asked += 1
            self.json_served_ok += parses(pair.served)
            self.json_shadow_ok += parses(pair.shadow)
        if not pair.greedy:
            return
        self.greedy += 1
        self.exact += pair.served == pair.shadow
        score = similarity(pair.served, pair.shadow)
        self.similarity_sum += score
        if score < 1.0:
            self.worst.append((score, pair.prompt_head, pair.served[:400], pair.shadow[:400]))
            self.worst.sort(key=lambda w: w[0])
            del self.worst[WORST_KEPT:]

    def report(self) -> dict[str, Any]:
        served, shadow = list(self.served_ttft), list(self.shadow_ttft)
        p50s, p50c = percentile(served, 0.5), percentile(shadow, 0.5)
        p99s, p99c = percentile(served, 0.99), percentile(shadow, 0.99)
        return {
            "compared": self.compared,
            "failed": self.failed,
            "dropped": self.dropped,
            "greedy": self.greedy,
            "exact_match_rate": self.exact / self.greedy if self.greedy else None,
            "similarity": self.similarity_sum / self.greedy if self.greedy else None,
            "json_asked": self.json_asked,
            "json_valid_served": self.json_served_ok / self.json_asked if self.json_asked else None,
            "json_valid_shadow": self.json_shadow_ok / self.json_asked if self.json_asked else None,
            "ttft_samples": len(served),
            "ttft_p50_s": {"served": p50s, "shadow": p50c},
            "ttft_p99_s": {"served": p99s, "shadow": p99c},
            "ttft_p50_ratio": p50c / p50s if p50s and p50c is not None else None,
            "worst": [{"similarity": s, "prompt": p, "served": a, "shadow": b} for s, p, a, b in self.worst],
        }
