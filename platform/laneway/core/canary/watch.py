"""The canary watch: each deployment's requests over a sliding window, the canary pool against
the serving pool, and the automatic rollback.

Every finished request of an alias that has a canary or a shadow is counted on the deployments
it touched: a failed try (core/pipeline/failover.py) as an error of the deployment that failed
it, even when another replica then answered (the client saw no error: the canary still
erred), the final answer as a success with its TTFT, or an error when it failed for laneway's
or an engine's reason (5xx). A client's own refusals and departures (4xx, 499) are no one's
error and are not counted.

A canary taking sessions (weight > 0) is rolled back (weight 0) once it has at least
`min_requests` in the window and either its error rate exceeds the serving pool's by more
than `error_margin` (an absolute share: 0.05 is five points), or its TTFT p99 exceeds the
serving pool's by more than `ttft_margin` (a share: 0.5 is 50 % slower), the serving pool
having `min_requests` successes to judge by. The weight is set to 0 here at once (the next
request goes to the serving pool), then `on_rollback` records it (the runtime writes the row,
audits it as laneway's, sends the alert). Requests already on the canary finish, or fail over.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from laneway.core.canary.compare import percentile
from laneway.core.canary.pools import CANARY, SERVING
from laneway.engines.registry import EngineRegistry, LiveDeployment

log = logging.getLogger("laneway.canary")

CLIENT_GONE = 499


class Tried(Protocol):
    @property
    def deployment(self) -> str: ...
    @property
    def reason(self) -> str: ...


class Finished(Protocol):
    """What the watch reads of a request's Outcome (core/pipeline/outcome.py)."""

    @property
    def model(self) -> str: ...
    @property
    def deployment(self) -> str: ...
    @property
    def status(self) -> int: ...
    @property
    def error_code(self) -> str | None: ...
    @property
    def ttft_ms(self) -> float | None: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cost_micros(self) -> int | None: ...
    @property
    def failed_tries(self) -> Iterable[Tried]: ...


@dataclass(frozen=True, slots=True)
class Margins:
    error_margin: float = 0.05
    ttft_margin: float = 0.5
    min_requests: int = 20
    window_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    error: str | None  # its code or reason; None: it succeeded
    ttft_s: float | None
    completion_tokens: int
    cost_micros: int


@dataclass
class Window:
    """One deployment's requests over the last `window_s` seconds (bounded in count too)."""

    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=20_000))
    total: Counter[str] = field(default_factory=Counter)  # since start: "ok" and each error (the metric)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        self.total[sample.error or "ok"] += 1

    def trim(self, since: float) -> None:
        while self.samples and self.samples[0].at < since:
            self.samples.popleft()


def pool_figures(samples: list[Sample]) -> dict[str, Any]:
    """TTFT p50/p99, errors by code, completion tokens and cost per request, with counts."""
    ttfts = [s.ttft_s for s in samples if s.ttft_s is not None]
    errors = Counter(s.error for s in samples if s.error is not None)
    n = len(samples)
    return {
        "requests": n,
        "errors": dict(errors),
        "error_rate": sum(errors.values()) / n if n else None,
        "ttft_samples": len(ttfts),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "completion_tokens_per_request": sum(s.completion_tokens for s in samples) / n if n else None,
        "cost_micros_per_request": sum(s.cost_micros for s in samples) / n if n else None,
    }


class CanaryWatch:
    def __init__(
        self, registry: EngineRegistry, margins: Margins | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry = registry
        self.margins = margins or Margins()
        self._clock = clock
        self.windows: dict[str, Window] = {}
        self.rollbacks: Counter[tuple[str, str, str]] = Counter()  # (alias, deployment, reason)
        # The runtime's: persist and audit the rollback, send the alert (alias, deployment, reason).
        self.on_rollback: Callable[[str, str, str], None] | None = None

    # ---- OutcomeSink ----
    def finished(self, outcome: Finished) -> None:
        replicas = self.registry.replicas(outcome.model)
        if all(d.role == SERVING for d in replicas):
            return  # no candidate: nothing to compare (the common case costs this loop)
        now = self._clock()
        for t in outcome.failed_tries:
            self._add(t.deployment, Sample(now, t.reason, None, 0, 0))
        last_failed = any(t.deployment == outcome.deployment for t in outcome.failed_tries)
        if outcome.status == 200:
            ttft = outcome.ttft_ms
            sample = Sample(
                now, None, None if ttft is None else ttft / 1000, outcome.completion_tokens, outcome.cost_micros or 0
            )
            self._add(outcome.deployment, sample)
        elif outcome.status >= 500 and outcome.status != CLIENT_GONE and not last_failed:
            self._add(outcome.deployment, Sample(now, outcome.error_code or str(outcome.status), None, 0, 0))
        self.check(replicas, now)

    def _add(self, deployment: str, sample: Sample) -> None:
        window = self.windows.get(deployment)
        if window is None:
            window = self.windows[deployment] = Window()
        window.add(sample)

    def _samples(self, replicas: Iterable[LiveDeployment], since: float) -> list[Sample]:
        out: list[Sample] = []
        for d in replicas:
            window = self.windows.get(d.spec.name)
            if window is not None:
                window.trim(since)
                out.extend(window.samples)
        return out

    # ---- the decision ----
    def check(self, replicas: list[LiveDeployment], now: float) -> None:
        m = self.margins
        since = now - m.window_s
        serving = self._samples([d for d in replicas if d.role == SERVING], since)
        for canary in [d for d in replicas if d.role == CANARY and d.weight > 0]:
            mine = self._samples([canary], since)
            if len(mine) < m.min_requests:
                continue
            reason = self._verdict(mine, serving)
            if reason is not None:
                self.roll_back(canary, reason)

    def _verdict(self, canary: list[Sample], serving: list[Sample]) -> str | None:
        m = self.margins
        c, s = pool_figures(canary), pool_figures(serving)
        serving_rate = s["error_rate"] or 0.0
        if c["error_rate"] is not None and c["error_rate"] > serving_rate + m.error_margin:
            return "error_rate"
        c99, s99 = c["ttft_p99_s"], s["ttft_p99_s"]
        judged = c["ttft_samples"] >= m.min_requests and s["ttft_samples"] >= m.min_requests
        if judged and c99 is not None and s99 is not None and c99 > s99 * (1 + m.ttft_margin):
            return "ttft_p99"
        return None

    def roll_back(self, canary: LiveDeployment, reason: str) -> None:
        alias, name = canary.spec.alias, canary.spec.name
        canary.weight = 0.0  # at once: the next session goes to the serving pool
        self.rollbacks[(alias, name, reason)] += 1
        log.warning("canary %s of %s rolled back by laneway: %s past its margin", name, alias, reason)
        if self.on_rollback is not None:
            try:
                self.on_rollback(alias, name, reason)
            except Exception:
                log.exception("recording the rollback of %s failed", name)

    # ---- what the admin and the metrics read ----
    def figures(self, replicas: list[LiveDeployment]) -> dict[str, Any]:
        """Per pool over the window: the serving pool's and each candidate's figures."""
        since = self._clock() - self.margins.window_s
        out: dict[str, Any] = {SERVING: pool_figures(self._samples([d for d in replicas if d.role == SERVING], since))}
        for d in replicas:
            if d.role != SERVING:
                out[d.spec.name] = {"role": d.role, "weight": d.weight, **pool_figures(self._samples([d], since))}
        return out
