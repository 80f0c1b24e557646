"""Every replica's latency model, by deployment name: the name outlives an engine swap or a
config edit, and the model's decay relearns a changed engine within a minute (replica.py).
With it, each replica's running limit learned against the lanes' TPOT targets (limit.py):
`on_limit` is told (name, new limit) so the replica's scheduler takes it as its room."""

from __future__ import annotations

import time
from collections.abc import Callable

from laneway.core.latency.limit import ConcurrencyLimit
from laneway.core.latency.replica import HALF_LIFE_S, Attempt, LatencyReadings, ReplicaLatencyModel
from laneway.engines.base import load_reporter
from laneway.engines.registry import LiveDeployment


class LatencyModels:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self._by_name: dict[str, ReplicaLatencyModel] = {}
        self.on_limit: Callable[[str, int], None] | None = None

    def of(self, name: str) -> ReplicaLatencyModel:
        model = self._by_name.get(name)
        if model is None:
            model = self._by_name[name] = ReplicaLatencyModel(self.half_life_s)
        return model

    def limit(self, deployment: LiveDeployment) -> ConcurrencyLimit:
        """The replica's learned running limit, bounded by its engine's own."""
        name = deployment.spec.name
        model = self.of(name)
        hard = deployment.engine.info.max_concurrency
        if model.limit is None:
            model.limit = ConcurrencyLimit(hard)
            model.limit.changed = lambda value: self._changed(name, value)
        else:
            model.limit.bound(hard)
        return model.limit

    def _changed(self, name: str, value: int) -> None:
        if self.on_limit is not None:
            self.on_limit(name, value)

    def begin(
        self,
        deployment: LiveDeployment,
        prompt_tokens: int,
        cached_tokens: int,
        now: float,
        tpot_target_s: float | None = None,
    ) -> Attempt:
        """A request took a slot on `deployment` at `now`: its attempt there, to be ended once;
        `tpot_target_s`, its lane's inter-token target, which the replica's limit is judged by."""
        engine = deployment.engine
        reporter = load_reporter(engine)
        reported = reporter.reported_load if reporter is not None else None
        self.limit(deployment)
        return self.of(deployment.spec.name).begin(now, prompt_tokens, cached_tokens, reported, tpot_target_s)

    def readings(self) -> dict[str, LatencyReadings]:
        """What each replica's model has learned, by deployment name (for /metrics and the
        admin's models page)."""
        now = time.perf_counter()
        return {name: model.readings(now) for name, model in self._by_name.items()}
