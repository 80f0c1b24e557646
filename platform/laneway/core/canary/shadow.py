"""Shadow traffic: a sampled copy of a live request runs on the alias's shadow deployment, in
the background, after the served answer is whole; its answer is never sent, only compared.

It never delays, preempts or bills anyone: the copy starts only once the live request's answer
has been produced (the client's stream is not held for it), it takes no slot of a serving
replica, leaves no usage row and is counted against no tenant's limits. At most `concurrency`
copies run at once across the gateway, and none beyond the shadow engine's own slots: a copy
that finds either full is dropped, not queued (counted as dropped). A shadow that fails is
counted as failed; no live request ever sees it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from laneway.core.canary.compare import Pair, ShadowFigures
from laneway.core.canary.pools import shadow_of
from laneway.engines.registry import EngineRegistry, LiveDeployment
from laneway.types import Delta, GenerationRequest

log = logging.getLogger("laneway.canary")


class Shadows:
    def __init__(
        self, registry: EngineRegistry, *, concurrency: int = 4, draw: Callable[[], float] = random.random
    ) -> None:
        self.registry = registry
        self.concurrency = concurrency
        self._draw = draw
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.figures: dict[str, ShadowFigures] = {}

    def sampled(self, alias: str) -> LiveDeployment | None:
        """The alias's shadow when this request is one of its sample, else None."""
        shadow = shadow_of(self.registry.replicas(alias))
        if shadow is None or self._draw() * 100 >= shadow.sample:
            return None
        return shadow

    def _of(self, shadow: LiveDeployment) -> ShadowFigures:
        name = shadow.spec.name
        found = self.figures.get(name)
        if found is None:
            found = self.figures[name] = ShadowFigures()
        return found

    async def recorded(
        self,
        deltas: AsyncGenerator[Delta, None],
        shadow: LiveDeployment,
        request: GenerationRequest,
        served_ttft: Callable[[], float | None],
    ) -> AsyncGenerator[Delta, None]:
        """`deltas` passed through as they come, the first choice's text kept; once the answer
        is whole (not when it failed or was cut), its copy is offered to the shadow."""
        request = dataclasses.replace(request, request_id=request.request_id + "-shadow", continuation=None)
        texts: list[str] = []
        try:
            async for delta in deltas:
                if delta.index == 0:
                    texts.append(delta.text)
                yield delta
        finally:
            await deltas.aclose()
        self.offer(shadow, request, "".join(texts), served_ttft())

    def offer(self, shadow: LiveDeployment, request: GenerationRequest, served: str, ttft_s: float | None) -> bool:
        figures = self._of(shadow)
        busy = self._running >= self.concurrency or shadow.outstanding >= shadow.engine.info.max_concurrency
        if busy or not shadow.healthy:
            figures.dropped += 1
            return False
        self._running += 1
        shadow.outstanding += 1  # its retirement (a swap, a removal) waits for the copy
        task = asyncio.create_task(self._run(shadow, request, served, ttft_s), name=f"shadow-{request.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _run(self, shadow: LiveDeployment, request: GenerationRequest, served: str, ttft_s: float | None) -> None:
        figures = self._of(shadow)
        started = time.perf_counter()
        first: float | None = None
        texts: list[str] = []
        try:
            run = shadow.engine.generate(request)
            try:
                async for delta in run:
                    if first is None and (delta.text or delta.tool_calls):
                        first = time.perf_counter() - started
                    if delta.index == 0:
                        texts.append(delta.text)
            finally:
                await run.aclose()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            figures.failed += 1
            log.debug("shadow %s failed %s: %s", shadow.spec.name, request.request_id, exc)
            return
        finally:
            self._running -= 1
            shadow.outstanding -= 1
        form = request.response_format or {}
        figures.add(
            Pair(
                served=served,
                shadow="".join(texts),
                served_ttft_s=ttft_s,
                shadow_ttft_s=first,
                greedy=request.temperature == 0,
                json_mode=form.get("type") in ("json_object", "json_schema"),
                prompt_head=request.prompt[:200],
            )
        )

    def report(self, alias: str) -> dict[str, Any] | None:
        shadow = next((d for d in self.registry.replicas(alias) if d.role == "shadow"), None)
        if shadow is None:
            return None
        return {"deployment": shadow.spec.name, "sample": shadow.sample, **self._of(shadow).report()}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
