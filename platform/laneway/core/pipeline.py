"""The request pipeline after auth.

  prepare()  resolve -> measure -> policy (max_tokens, stops) -> route (lane)      no waiting
  admit()    rate limit (reserve) -> admission -> schedule (wait for a slot)       may refuse
  run()      generate, enforcing stops; always ends in finish()
  finish()   release slot, settle the rate limit (refund unused tokens), account   idempotent

The HTTP layer calls them in this order; a GatewayError from any of them is the client's
answer. finish() runs exactly once however the request ends (done, error, disconnect,
refused), so no slot, reservation or usage row is ever lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from laneway.core import admission
from laneway.core.accounting import UsageRecorder
from laneway.core.errors import GatewayError
from laneway.core.policy import LanePolicy, PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter
from laneway.core.routing import LaneRouter
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.core.stops import StopMatcher
from laneway.engines.base import EngineError
from laneway.engines.registry import EngineRegistry, LiveDeployment, UnknownModel
from laneway.metrics import GatewayMetrics
from laneway.types import ChatTurn, Delta, FinishReason, GenerationRequest, TenantSnapshot

log = logging.getLogger("laneway.pipeline")

CLIENT_CLOSED = 499  # nginx's status for "the client went away first"


@dataclass(eq=False)
class Call:
    request_id: str
    tenant: TenantSnapshot
    alias: str
    endpoint: str
    stream: bool
    deployment: LiveDeployment
    generation: GenerationRequest
    lane: LanePolicy
    task: str | None = None
    end_user: str | None = None  # the request's `user`: who, behind the tenant, asked
    started: float = field(default_factory=time.perf_counter)
    dispatched_at: float | None = None
    first_token_at: float | None = None
    completion_tokens: int = 0
    finish_reason: FinishReason | None = None
    status: int = 200
    error_code: str | None = None
    reserved_tokens: int = 0
    ticket: Ticket | None = None
    finished: bool = False

    @property
    def prompt_tokens(self) -> int:
        return self.generation.prompt_tokens

    @property
    def queue_ms(self) -> float | None:
        return None if self.dispatched_at is None else (self.dispatched_at - self.started) * 1000

    @property
    def fingerprint(self) -> str:
        return f"laneway-{self.deployment.spec.engine_kind}"


class Gateway:
    def __init__(
        self,
        registry: EngineRegistry,
        recorder: UsageRecorder,
        policies: PolicyStore,
        limiter: RateLimiter | None = None,
        *,
        default_max_tokens: int = 512,
        quantum: int = 64,
        starvation_share: float = 0.1,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.registry = registry
        self.recorder = recorder
        self.policies = policies
        self.limiter: RateLimiter = limiter or MemoryRateLimiter()
        self.router = LaneRouter()
        self.default_max_tokens = default_max_tokens
        self._quantum = quantum
        self._starvation_share = starvation_share
        # Keyed by the live deployment itself: a swapped-in replacement gets its own scheduler,
        # and a retired one's goes with it.
        self._schedulers: weakref.WeakKeyDictionary[LiveDeployment, DeploymentScheduler] = weakref.WeakKeyDictionary()
        self._background: set[asyncio.Task[None]] = set()
        self.metrics = metrics or GatewayMetrics()
        self.metrics.watch_queues(self.queue_stats)

    def visible_models(self, tenant: TenantSnapshot) -> list[str]:
        return [a for a in self.registry.aliases() if tenant.may_use(a)]

    def scheduler(self, deployment: LiveDeployment) -> DeploymentScheduler:
        s = self._schedulers.get(deployment)
        if s is None:
            s = self._schedulers[deployment] = DeploymentScheduler(
                deployment.engine.info.max_concurrency, quantum=self._quantum, starvation_share=self._starvation_share
            )
        return s

    def queue_stats(self) -> list[tuple[dict[str, str], int, int]]:
        """Waiting and running requests per deployment and lane (every configured lane listed)."""
        out = []
        lanes = [lane.name for lane in self.policies.current.lanes]
        for d in self.registry.deployments():
            info = d.engine.info
            base = {
                "deployment": d.spec.name,
                "model": d.spec.alias,
                "quantization": info.quantization,
                "gpu_type": info.gpu_type,
                "engine": info.engine,
            }
            seen = {name: (w, r) for name, w, r in self.scheduler(d).lane_stats()}
            for name in sorted(set(lanes) | set(seen)):
                waiting, running = seen.get(name, (0, 0))
                out.append(({**base, "lane": name}, waiting, running))
        return out

    async def prepare(
        self,
        tenant: TenantSnapshot,
        *,
        endpoint: str,
        alias: str,
        stream: bool,
        prompt: str | None = None,
        messages: Sequence[ChatTurn] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        user: str | None = None,
        task: str | None = None,
        lane: str | None = None,
        priority: int = 0,
    ) -> Call:
        try:
            any_replica = self.registry.resolve(alias)  # replicas of an alias share a tokenizer
        except UnknownModel:
            raise GatewayError(
                404,
                f"The model '{alias}' does not exist or you do not have access to it.",
                code="model_not_found",
                param="model",
            ) from None
        if not tenant.may_use(alias):
            raise GatewayError(
                403, f"Your key is not allowed to use the model '{alias}'.", code="model_not_allowed", param="model"
            )
        measured = await any_replica.engine.measure(prompt=prompt, messages=messages)
        snapshot = self.policies.current
        chosen = self.router.route(
            snapshot, prompt_tokens=measured.tokens, stream=stream, task=task, explicit_lane=lane
        )
        deployment = self.registry.resolve(alias, chosen.name)
        context = deployment.engine.info.max_model_len
        room = context - measured.tokens
        if room <= 0:
            raise GatewayError(
                413,
                f"This model's maximum context length is {context} tokens; your prompt has "
                f"{measured.tokens} tokens and leaves no room for a completion.",
                code="context_length_exceeded",
                param="messages" if messages else "prompt",
            )
        budget = snapshot.max_tokens(
            task=task, prompt_tokens=measured.tokens, requested=max_tokens, room=room, default=self.default_max_tokens
        )
        stops = snapshot.stops(task=task, model_stops=deployment.spec.config.get("stop", ()), requested=stop)
        request_id = ("chatcmpl-" if messages is not None else "cmpl-") + uuid.uuid4().hex
        generation = GenerationRequest(
            request_id=request_id,
            prompt=measured.text,
            prompt_tokens=measured.tokens,
            max_tokens=budget,
            messages=tuple(messages) if messages is not None else None,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=seed,
            stop=stops,
            priority=priority,
        )
        return Call(
            request_id=request_id,
            tenant=tenant,
            alias=alias,
            endpoint=endpoint,
            stream=stream,
            deployment=deployment,
            generation=generation,
            lane=chosen,
            task=task,
            end_user=user[:200] if user else None,
        )

    async def admit(self, call: Call) -> None:
        """Reserve rate limit, pass admission, wait for an engine slot. On any refusal (or the
        client leaving while queued) the call is finished and the error re-raised."""
        call.deployment.outstanding += 1  # queued counts too: least-outstanding routing sees the backlog
        try:
            tokens = call.prompt_tokens + call.generation.max_tokens
            await self.limiter.reserve(call.tenant, tokens, call.request_id)
            call.reserved_tokens = tokens
            scheduler = self.scheduler(call.deployment)
            admission.admit(scheduler, call.lane)
            ticket = Ticket(
                request_id=call.request_id,
                tenant_id=call.tenant.id,
                weight=call.tenant.weight,
                cost=tokens,
                lane=call.lane,
            )
            await scheduler.acquire(ticket)
            call.ticket = ticket
            call.dispatched_at = time.perf_counter()
        except GatewayError as exc:
            call.status, call.error_code = exc.status, exc.code
            await self.finish(call)
            raise
        except BaseException:
            call.status, call.error_code = CLIENT_CLOSED, "client_disconnected"
            await self.finish(call)
            raise

    async def run(self, call: Call) -> AsyncGenerator[Delta, None]:
        """Yield deltas with non-empty text, then one with finish_reason. Requires admit()."""
        assert call.ticket is not None, "admit() first"
        deployment = call.deployment
        matcher = StopMatcher(call.generation.stop)
        engine_stream = deployment.engine.generate(call.generation)
        try:
            async for delta in engine_stream:
                call.completion_tokens += delta.tokens
                text = matcher.feed(delta.text)
                if matcher.stopped:
                    call.finish_reason = "stop"
                elif delta.finish_reason is not None:
                    text += matcher.flush()
                    call.finish_reason = delta.finish_reason
                if text and call.first_token_at is None:
                    call.first_token_at = time.perf_counter()
                if call.finish_reason is not None:
                    self.registry.record(deployment, ok=True)
                    yield Delta(text=text, tokens=0, finish_reason=call.finish_reason)
                    return
                if text:
                    yield Delta(text=text, tokens=delta.tokens)
            call.finish_reason = "length"  # an engine that ends without a reason ran out of tokens
            yield Delta(text=matcher.flush(), tokens=0, finish_reason="length")
        except EngineError as exc:
            log.error("engine error on %s (%s): %s", call.request_id, deployment.spec.name, exc)
            self.registry.record(deployment, ok=False)
            call.status, call.error_code = 503, "engine_error"
            raise GatewayError(
                503, f"The engine serving '{call.alias}' failed: {exc}", code="engine_error", retry_after=1
            ) from exc
        except (asyncio.CancelledError, GeneratorExit):
            if call.error_code is None:  # a cause set by the closer (e.g. backpressure) stands
                call.status, call.error_code = CLIENT_CLOSED, "client_disconnected"
            raise
        finally:
            await engine_stream.aclose()  # closing the engine stream is the cancellation
            await self.finish(call)

    async def finish(self, call: Call) -> None:
        if call.finished:
            return
        call.finished = True
        call.deployment.outstanding -= 1
        if call.ticket is not None:
            self.scheduler(call.deployment).release(call.ticket)
        if call.reserved_tokens:
            used = call.prompt_tokens + call.completion_tokens
            try:
                await self.limiter.settle(call.tenant, call.request_id, call.reserved_tokens - used)
            except Exception:
                log.exception("settling the rate limit of %s failed", call.request_id)
        self._account(call)

    def finish_later(self, call: Call) -> None:
        """finish() from synchronous code (a finalizer); a no-op for a finished call."""
        if not call.finished:
            task = asyncio.ensure_future(self.finish(call))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _account(self, call: Call) -> None:
        now = time.perf_counter()
        self.metrics.observe(call, now)
        self.recorder.record(
            {
                "request_id": call.request_id,
                "tenant_id": call.tenant.id,
                "api_key_id": call.tenant.api_key_id,
                "model": call.alias,
                "deployment": call.deployment.spec.name,
                "lane": call.lane.name,
                "endpoint": call.endpoint,
                "stream": call.stream,
                "end_user": call.end_user,
                "status": call.status,
                "finish_reason": call.finish_reason,
                "error_code": call.error_code,
                "prompt_tokens": call.prompt_tokens,
                "completion_tokens": call.completion_tokens,
                "queue_ms": call.queue_ms,
                "ttft_ms": None if call.first_token_at is None else (call.first_token_at - call.started) * 1000,
                "total_ms": (now - call.started) * 1000,
            }
        )
