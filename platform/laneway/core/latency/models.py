"""Every replica's latency model, by deployment name: the name outlives an engine swap or a
config edit, and the model's decay relearns a changed engine within a minute (replica.py)."""

from __future__ import annotations

import time

from laneway.core.latency.replica import HALF_LIFE_S, Attempt, LatencyReadings, ReplicaLatencyModel
from laneway.engines.base import LoadReportingEngine
from laneway.engines.registry import LiveDeployment


class LatencyModels:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self._by_name: dict[str, ReplicaLatencyModel] = {}

    def of(self, name: str) -> ReplicaLatencyModel:
        model = self._by_name.get(name)
        if model is None:
            model = self._by_name[name] = ReplicaLatencyModel(self.half_life_s)
        return model

    def begin(self, deployment: LiveDeployment, prompt_tokens: int, cached_tokens: int, now: float) -> Attempt:
        """A request took a slot on `deployment` at `now`: its attempt there, to be ended once."""
        engine = deployment.engine
        reported = engine.reported_load if isinstance(engine, LoadReportingEngine) else None
        return self.of(deployment.spec.name).begin(now, prompt_tokens, cached_tokens, reported)

    def readings(self) -> dict[str, LatencyReadings]:
        """What each replica's model has learned, by deployment name (for /metrics and the
        admin's models page)."""
        now = time.perf_counter()
        return {name: model.readings(now) for name, model in self._by_name.items()}
