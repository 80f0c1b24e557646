"""Failover: a replica that fails a request costs the client nothing. Before the first byte
the request goes to another healthy replica of its alias and starts again; after it, the
answer continues there (core/pipeline/continuation.py). Either way at most `max_tries` tries in
all, within a retry budget per deployment so that a failing fleet is not hammered with
amplified load.

What counts as the replica's failure: an engine error (a refused connection, a 5xx, a stream
dropped or an error event), no first token within the deployment's `first_token_timeout_s`,
or no next token within its `inter_token_timeout_s` (without one: within a multiple of the
inter-token time its replica's latency model learned, never under a floor; StallRule). The client's own errors
(EngineRequestError: a 400 from the engine) are never retried, nor is a client that left.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from laneway.core.pipeline.call import Call, FailedTry
from laneway.engines.base import EngineError
from laneway.engines.registry import EngineRegistry, LiveDeployment, NotServed, UnknownModel

if TYPE_CHECKING:
    from laneway.core.latency import Attempt


class EarlyEngineFailure(Exception):
    """The engine failed before the call's first delta reached its consumer: it may go elsewhere."""

    def __init__(self, error: EngineError, reason: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.reason = reason  # "connect", "first_token_timeout", "inter_token_timeout" or "engine_error"


def failure_reason(error: EngineError) -> str:
    """A bounded label for why a replica failed (metrics, the usage row)."""
    if isinstance(error, FirstTokenTimeout):
        return "first_token_timeout"
    if isinstance(error, InterTokenTimeout):
        return "inter_token_timeout"
    cause = error.__cause__ or error.__context__
    if isinstance(cause, ConnectionError | TimeoutError) or isinstance(error.__cause__, OSError):
        return "connect"
    return "engine_error"


class FirstTokenTimeout(EngineError):
    pass


class InterTokenTimeout(EngineError):
    """The answer began, then no token came within the deployment's inter_token_timeout_s (or
    the StallRule's limit)."""


@dataclass(frozen=True, slots=True)
class StallRule:
    """A stall where a deployment sets no inter_token_timeout_s: no token for `multiple` times
    the decode step its replica's latency model learned (at the batch it runs now), and never
    less than `floor_s`. A replica that is merely slow has learned a slow step and is given
    its time; one whose model has learned nothing yet is waited for, as before. 0: off."""

    multiple: float = 20.0
    floor_s: float = 5.0

    def limit(self, attempt: Attempt | None) -> float | None:
        """Seconds without a token after which the attempt's replica has stalled, or None."""
        if attempt is None or self.multiple <= 0:
            return None
        model = attempt.model
        step = model.predict_step(max(model.running, 1))
        return None if step is None else max(self.floor_s, self.multiple * step)


class RetryBudget:
    """Retries a deployment may cause: at most `ratio` of its requests over the last `window_s`
    seconds, and never fewer than `minimum` (a quiet deployment may still fail over). Counted
    in one-second buckets, so memory stays bounded whatever the rate."""

    def __init__(
        self, ratio: float = 0.1, minimum: int = 3, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ratio = ratio
        self.minimum = minimum
        self.window = max(1, math.ceil(window_s))
        self._clock = clock
        # deployment -> deque of [second, requests, retries], oldest first
        self._buckets: dict[str, deque[list[int]]] = {}

    def _bucket(self, deployment: str) -> list[int]:
        now = int(self._clock())
        buckets = self._buckets.setdefault(deployment, deque())
        while buckets and buckets[0][0] <= now - self.window:
            buckets.popleft()
        if not buckets or buckets[-1][0] != now:
            buckets.append([now, 0, 0])
        return buckets[-1]

    def requested(self, deployment: str) -> None:
        self._bucket(deployment)[1] += 1

    def spend(self, deployment: str) -> bool:
        """Take one retry from the failed deployment's budget; False when it has none left."""
        current = self._bucket(deployment)
        buckets = self._buckets[deployment]
        requests = sum(b[1] for b in buckets)
        retries = sum(b[2] for b in buckets)
        if retries + 1 > max(self.minimum, self.ratio * requests):
            return False
        current[2] += 1
        return True


class Failover:
    def __init__(
        self,
        registry: EngineRegistry,
        *,
        max_tries: int = 2,
        budget: RetryBudget | None = None,
        continuation: bool = True,
        stall: StallRule | None = None,
    ) -> None:
        self.registry = registry
        self.max_tries = max_tries
        self.continuation = continuation  # false: a mid-answer failure is not continued
        self.stall = stall or StallRule()
        self.budget = budget or RetryBudget()

    def next_replica(
        self,
        call: Call,
        reason: str,
        *,
        continued: bool = False,
        suitable: Callable[[LiveDeployment], bool] | None = None,
    ) -> LiveDeployment | None:
        """Where the call goes after its replica failed (for `reason`), or None (then the
        failure is final): the tries are spent, the failed deployment's retry budget is, or no
        other replica of the alias can serve the call's lane and capabilities (and, when given,
        is `suitable`: one that can continue the answer). `continued`: the move continues an
        answer rather than starting it again."""
        failed = call.deployment.spec.name
        call.failed_tries.append(FailedTry(failed, reason, continued))
        if len(call.failed_tries) >= self.max_tries:
            return None
        passed = frozenset(t.deployment for t in call.failed_tries)
        while True:
            try:
                target = self.registry.resolve(call.alias, call.lane.name, call.needs, exclude=passed)
            except (UnknownModel, NotServed):
                return None
            if not call.needs <= target.engine.info.capabilities:
                return None
            if suitable is None or suitable(target):
                break
            passed |= {target.spec.name}
        # A canary's failures are not charged to the budget: the canary watch bounds them
        # instead (it takes the canary out past its error margin, core/canary/watch.py), and
        # its clients would otherwise pay for a candidate's faults the serving pool can answer.
        # Nor is a continuation: it carries on an answer the failed replica no longer carries
        # (no load is added), at most once a try for a stream already flowing, so it cannot
        # become the storm the budget guards against; charged, a replica dying under more
        # streams than the budget's minimum would cut all but that many of them.
        if not continued and call.deployment.role != "canary" and not self.budget.spend(failed):
            call.retry_denied = "budget"
            return None
        return target
