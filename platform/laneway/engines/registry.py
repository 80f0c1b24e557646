"""Which engine serves which model alias: built from deployment rows, swapped without restart."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from laneway.db.repositories import DeploymentSpec
from laneway.engines.base import Engine, EngineError
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.sim import SimEngine

log = logging.getLogger("laneway.engines")

EngineFactory = Callable[..., Any]
ENGINE_KINDS: dict[str, EngineFactory] = {"llamacpp": LlamaCppEngine, "sim": SimEngine}


class UnknownModel(LookupError):
    pass


@dataclass(eq=False)
class LiveDeployment:
    spec: DeploymentSpec
    engine: Engine
    outstanding: int = 0  # requests admitted to this deployment and not yet finished


def build_engine(spec: DeploymentSpec) -> Engine:
    factory = ENGINE_KINDS.get(spec.engine_kind)
    if factory is None:
        raise EngineError(f"unknown engine kind {spec.engine_kind!r} (known: {', '.join(sorted(ENGINE_KINDS))})")
    engine: Engine = factory(
        spec.alias,
        spec.config,
        quantization=spec.quantization,
        gpu_type=spec.gpu_type,
        max_model_len=spec.max_model_len,
    )
    return engine


class EngineRegistry:
    def __init__(self) -> None:
        self._by_alias: dict[str, list[LiveDeployment]] = {}
        self.failed: dict[str, str] = {}  # deployment name -> why it could not start

    async def load(self, specs: Sequence[DeploymentSpec]) -> None:
        for spec in specs:
            try:
                engine = build_engine(spec)
                await engine.start()
            except Exception as exc:
                log.error("deployment %s (%s) failed to start: %s", spec.name, spec.engine_kind, exc)
                self.failed[spec.name] = str(exc)
                continue
            self._by_alias.setdefault(spec.alias, []).append(LiveDeployment(spec=spec, engine=engine))
            log.info("deployment %s serves %s via %s", spec.name, spec.alias, spec.engine_kind)

    async def close(self) -> None:
        for deployments in self._by_alias.values():
            for d in deployments:
                await d.engine.close()
        self._by_alias.clear()

    def aliases(self) -> list[str]:
        return sorted(self._by_alias)

    def deployments(self) -> list[LiveDeployment]:
        return [d for ds in self._by_alias.values() for d in ds]

    def resolve(self, alias: str, lane: str | None = None) -> LiveDeployment:
        """The deployment to serve `alias` in `lane`.

        Deployments list the lanes they serve in config "lanes" (none listed: every lane).
        Those dedicated to the lane come first while one has a free engine slot; beyond that
        (or without any) every deployment serving the lane competes. Among the chosen, the
        fewest outstanding requests wins (queued ones count, so a backlog is avoided).
        """
        candidates = self._by_alias.get(alias)
        if not candidates:
            raise UnknownModel(alias)
        if lane is not None:
            candidates = [d for d in candidates if lane in d.spec.config.get("lanes", (lane,))] or candidates
            dedicated = [
                d
                for d in candidates
                if lane in d.spec.config.get("lanes", ()) and d.outstanding < d.engine.info.max_concurrency
            ]
            candidates = dedicated or candidates
        return min(candidates, key=lambda d: d.outstanding)

    @property
    def ready(self) -> bool:
        return not self.failed and bool(self._by_alias)
