"""The request pipeline after auth.

  prepare()  resolve -> measure -> policy (max_tokens, stops) -> route (lane)      no waiting
  lease()    open the request's Lease (no await)                                    owned from here
  acquire()  rate limit (reserve) -> admission -> schedule (wait for a slot)       may refuse
             each resource is taken into the lease
  run(lease) generate, enforcing stops           (embeddings: embed(lease) instead, see below)
  lease.release()  the only release: engine slot, outstanding, rate-limit reservation
             (settled with the tokens actually used), usage row and metrics. Idempotent.

Ownership: the lease is opened before the first await, and its owner releases it from one
`finally` whatever happens (the HTTP layer hands it to the response that streams the body,
which then owns it). admit() = lease() + acquire() for callers that are not an HTTP request.
The outcome is classified once, by
whoever first knows it (`Call.fail`): the client leaving is 499; an engine fault, a
dependency or a shutdown is 503 (500 for a bug), with its own code, never mistaken for 499.

Embeddings take the same path as a generation-less call: prepare_embeddings() measures every
input and routes the call (task "embeddings" unless the client names one) to a deployment
that declares the capability; its GenerationRequest has max_tokens 0, so the rate-limit
reservation, the scheduler's cost and the settled usage are its input tokens, and the usage
row is an ordinary one (endpoint "embeddings", completion tokens 0). embed(lease) replaces
run(lease); the lease, its release and the outcome classification are the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, shutting_down
from laneway.core import capabilities, load_shedding
from laneway.core.accounting import UsageRecorder
from laneway.core.ids import random_hex
from laneway.core.policy import LanePolicy, PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, Reservation
from laneway.core.routing import LaneRouter
from laneway.core.scheduler import DeploymentScheduler, Ticket
from laneway.core.shared_slots import SharedScheduler, SharedSlots
from laneway.core.stops import StopMatcher
from laneway.engines.base import EngineError, EngineRequestError, embedder
from laneway.engines.registry import EngineRegistry, LiveDeployment, NotServed, UnknownModel
from laneway.metrics import GatewayMetrics
from laneway.types import ChatTurn, Delta, EmbeddingRequest, Embeddings, FinishReason, GenerationRequest, TenantSnapshot

if TYPE_CHECKING:
    from laneway.tracing.otel import RequestTrace

log = logging.getLogger("laneway.pipeline")

CLIENT_CLOSED = 499  # nginx's status for "the client went away first"
# Tokens one embeddings request may ask for, all inputs together: OpenAI's own limit, so a
# client written for OpenAI already batches within it.
MAX_EMBEDDING_TOKENS = 300_000
Scheduler = DeploymentScheduler | SharedScheduler
# A request's id is the id of the object it answers with (the Responses API's are resp_...).
_ID_PREFIX = {"responses": "resp_"}


def engine_request_id(request_id: str, client_request_id: str | None) -> str:
    """The id the engine (and its logs) sees: the client's, made unique by the gateway's own,
    since engines key running requests by it."""
    return request_id if client_request_id is None else f"{client_request_id}:{request_id}"


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
    embedding: EmbeddingRequest | None = None  # an embeddings call (its generation has max_tokens 0)
    started: float = field(default_factory=time.perf_counter)
    dispatched_at: float | None = None
    first_token_at: float | None = None
    completion_tokens: int = 0
    finish_reason: FinishReason | None = None
    status: int = 200
    error_code: str | None = None
    reported_prompt_tokens: int | None = None  # the engine's exact count, when it reports one
    client_request_id: str | None = None  # the client's own X-Request-Id (api/request_ids.py)
    trace: RequestTrace | None = None  # its spans, when tracing is on (laneway/tracing/): else no tracer call

    def fail(self, status: int, code: str | None) -> None:
        """Record why the request did not end well; the first cause stands (a backpressure
        cut or a shutdown is not relabelled by the cancellation it causes)."""
        if self.error_code is None and self.status == 200:
            self.status, self.error_code = status, code

    @property
    def prompt_tokens(self) -> int:
        """The engine's count when it reported one, else the gateway's measurement (which may
        be an estimate: it only routed and reserved)."""
        return self.reported_prompt_tokens or self.generation.prompt_tokens

    @property
    def public_id(self) -> str:
        """The id the client and the usage row know this request by: the client's X-Request-Id
        when it sent one (not unique: never a key), else request_id. Logs name
        generation.request_id, which holds both."""
        return self.client_request_id or self.request_id

    @property
    def queue_ms(self) -> float | None:
        return None if self.dispatched_at is None else (self.dispatched_at - self.started) * 1000

    @property
    def fingerprint(self) -> str:
        return f"laneway-{self.deployment.spec.engine_kind}"


@dataclass(eq=False)
class Lease:
    """Everything an admitted request holds: the deployment's outstanding count, the rate-limit
    reservation (with its concurrency holder) and the engine slot. release() is the only
    release of any of them; it never awaits, so no cancellation can stop it half-way."""

    gateway: Gateway
    call: Call
    reservation: Reservation | None = None
    ticket: Ticket | None = None
    holds_deployment: bool = False
    released: bool = False
    # How to end the generation early (shutdown): set by whoever is running it.
    interrupter: Callable[[GatewayError], None] | None = None
    _run: Any = None  # the run() async generator (its ag_frame / ag_running tell its state)
    _generation_ended: bool = False

    def end_generation(self) -> None:
        """Give back the engine slot and the outstanding count (idempotent)."""
        if self._generation_ended:
            return
        self._generation_ended = True
        if self.call.trace is not None:
            self.call.trace.engine_ended(self.call)
        if self.holds_deployment:
            self.call.deployment.outstanding -= 1
        if self.ticket is not None:
            self.gateway.scheduler(self.call.deployment).release(self.ticket)

    def interrupt(self, error: GatewayError) -> None:
        """End this request early with `error` (shutdown): the client gets it as an error event
        (stream) or an error response; the engine stops."""
        self.call.fail(error.status, error.code)
        if self.interrupter is not None:
            self.interrupter(error)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        run = self._run
        if run is None or run.ag_frame is None:  # never generated, or generation over
            self.end_generation()
        elif not run.ag_running:  # suspended, nobody will resume it: close it, then free the slot
            self.gateway.spawn(self._close_run(run))
        # else: run() is executing right now, and its own `finally` ends the generation.
        call = self.call
        if self.reservation is not None:
            self.gateway.limiter.settle(self.reservation, call.prompt_tokens + call.completion_tokens)
        self.gateway.account(call)
        if call.trace is not None:  # the request span ends with the request, whatever ended it
            call.trace.finish(call)
        self.gateway.forget(self)

    async def _close_run(self, run: Any) -> None:
        try:
            await run.aclose()
        finally:
            self.end_generation()


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
        headroom: int = 1,
        metrics: GatewayMetrics | None = None,
        shared_slots: SharedSlots | None = None,
    ) -> None:
        self.registry = registry
        self.shared_slots = shared_slots
        self.recorder = recorder
        self.policies = policies
        self.limiter: RateLimiter = limiter or MemoryRateLimiter()
        self.router = LaneRouter()
        self.default_max_tokens = default_max_tokens
        self._quantum = quantum
        self._starvation_share = starvation_share
        self._headroom = headroom
        # Keyed by the live deployment itself: a swapped-in replacement gets its own scheduler,
        # and a retired one's goes with it.
        self._schedulers: weakref.WeakKeyDictionary[LiveDeployment, Scheduler] = weakref.WeakKeyDictionary()
        self._background: set[asyncio.Task[Any]] = set()
        self._leases: set[Lease] = set()  # opened and not yet released
        self._leases_opened = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False  # shutdown has begun: no new admissions
        self.metrics = metrics or GatewayMetrics()
        self.metrics.watch_queues(self.queue_stats)

    def capabilities(self, alias: str) -> frozenset[str]:
        return self.registry.capabilities(alias)

    def visible_models(self, tenant: TenantSnapshot) -> list[str]:
        return [a for a in self.registry.aliases() if tenant.may_use(a)]

    def scheduler(self, deployment: LiveDeployment) -> Scheduler:
        """The deployment's scheduler: in this process for an engine only this replica uses (one
        running in-process, or no Redis to share through), in Redis for a remote engine that
        several replicas front (core/shared_slots.py)."""
        s = self._schedulers.get(deployment)
        if s is None:
            capacity = deployment.engine.info.max_concurrency
            local: dict[str, Any] = {
                "quantum": self._quantum,
                "starvation_share": self._starvation_share,
                "headroom": self._headroom,
            }
            if self.shared_slots is not None and deployment.shared:
                s = self.shared_slots.scheduler(deployment.spec.name, capacity, **local)
            else:
                s = DeploymentScheduler(capacity, **local)
            self._schedulers[deployment] = s
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
        n: int = 1,
        tools: Sequence[dict[str, Any]] = (),
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        response_format: dict[str, Any] | None = None,
        logprobs: int | None = None,
        logit_bias: dict[int, float] | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        client_request_id: str | None = None,
    ) -> Call:
        any_replica = self._accessible(tenant, alias, lane)  # replicas of an alias share a tokenizer
        priority = max(priority, tenant.priority_floor)  # no more urgent than the tenant may ask
        offered = tuple(tools) if tool_choice != "none" else ()
        form = response_format if (response_format or {}).get("type", "text") != "text" else None
        measured = await any_replica.engine.measure(prompt=prompt, messages=messages, tools=offered,
                                                    response_format=form)  # fmt: skip
        snapshot = self.policies.current
        chosen = self.router.route(
            snapshot, prompt_tokens=measured.tokens, stream=stream, task=task, explicit_lane=lane
        )
        # What the request asks beyond text: the deployment chosen must be able to do it.
        generation = GenerationRequest(
            request_id="",
            prompt=measured.text,
            prompt_tokens=measured.tokens,
            prompt_ids=measured.ids,
            max_tokens=0,
            n=n,
            tools=tuple(tools),
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            response_format=form,
            logprobs=logprobs,
            logit_bias=logit_bias or None,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
        )
        needs = frozenset(c for c, _ in capabilities.asked(generation))
        deployment = self.registry.resolve(alias, chosen.name, needs)
        context = deployment.engine.info.max_model_len
        room = context - measured.tokens
        if room <= 0:
            raise GatewayError(  # 400, as OpenAI answers it (the SDKs raise BadRequestError)
                ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                f"This model's maximum context length is {context} tokens; your prompt has "
                f"{measured.tokens} tokens and leaves no room for a completion.",
                param="messages" if messages else "prompt",
            )
        budget = snapshot.max_tokens(
            task=task, prompt_tokens=measured.tokens, requested=max_tokens, room=room, default=self.default_max_tokens
        )
        stops = snapshot.stops(task=task, model_stops=deployment.spec.config.get("stop", ()), requested=stop)
        # The body's id, whatever X-Request-Id the client sent: OpenAI's shape, unique per completion.
        request_id = _ID_PREFIX.get(endpoint, "chatcmpl-" if messages is not None else "cmpl-") + random_hex()
        capabilities.check(deployment.engine.info, alias, generation)
        generation.request_id = engine_request_id(request_id, client_request_id)
        generation.max_tokens = budget
        generation.messages = tuple(messages) if messages is not None else None
        generation.temperature = 1.0 if temperature is None else temperature
        generation.top_p = 1.0 if top_p is None else top_p
        generation.seed = seed
        generation.stop = stops
        generation.priority = priority
        generation.stream = stream
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
            client_request_id=client_request_id,
        )

    def _accessible(
        self, tenant: TenantSnapshot, alias: str, lane: str | None, *, embeddings: bool = False
    ) -> LiveDeployment:
        """A deployment of `alias` that serves the kind of request, once the tenant may use the
        model (and the lane it names): else 404, 403, or 400 naming the model."""
        try:
            deployment = self.registry.resolve(alias, embeddings=embeddings)
        except UnknownModel:
            raise GatewayError(
                ErrorCode.MODEL_NOT_FOUND,
                f"The model '{alias}' does not exist or you do not have access to it.",
                param="model",
            ) from None
        except NotServed:
            deployment = None
        if not tenant.may_use(alias):  # before saying what the model serves: a key that may not use it learns nothing
            raise GatewayError(
                ErrorCode.MODEL_NOT_ALLOWED, f"Your key is not allowed to use the model '{alias}'.", param="model"
            )
        if deployment is None:
            what = (
                "does not serve embeddings (its deployments generate text)"
                if embeddings
                else "serves embeddings only (POST /v1/embeddings); it does not generate text"
            )
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, f"The model '{alias}' {what}.", param="model")
        if lane is not None and lane not in tenant.allowed_lanes:
            raise GatewayError(
                ErrorCode.LANE_NOT_ALLOWED,
                f"Tenant '{tenant.name}' may not choose a lane (asked for '{lane}'); its requests are routed "
                "by the lane rules. An admin can allow lanes per tenant.",
                param="X-Laneway-Lane",
            )
        return deployment

    async def prepare_embeddings(
        self,
        tenant: TenantSnapshot,
        *,
        alias: str,
        inputs: Sequence[str],
        user: str | None = None,
        task: str | None = None,
        lane: str | None = None,
        priority: int = 0,
        client_request_id: str | None = None,
    ) -> Call:
        """prepare() for POST /v1/embeddings: resolve to a deployment that declares "embeddings",
        measure each input, refuse one beyond the context (as OpenAI does, never truncated),
        route by the inputs' total tokens and task "embeddings"."""
        any_replica = self._accessible(tenant, alias, lane, embeddings=True)
        priority = max(priority, tenant.priority_floor)
        engine = embedder(any_replica.engine)
        if engine is None:  # declared the capability without implementing it: a bug in the adapter
            raise EngineError(f"deployment {any_replica.spec.name} declares embeddings but cannot embed")
        counts = await engine.measure_inputs(inputs)
        total = sum(counts)
        if total > MAX_EMBEDDING_TOKENS:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"The inputs have {total} tokens together; one request may have at most {MAX_EMBEDDING_TOKENS}. "
                "Send them in smaller batches.",
                param="input",
            )
        task = task or "embeddings"
        chosen = self.router.route(self.policies.current, prompt_tokens=total, stream=False, task=task,
                                   explicit_lane=lane)  # fmt: skip
        deployment = self.registry.resolve(alias, chosen.name, embeddings=True)
        context = deployment.engine.info.max_model_len
        longest = max(range(len(counts)), key=counts.__getitem__)
        if counts[longest] > context:
            raise GatewayError(
                ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                f"This model's maximum context length is {context} tokens; input[{longest}] has "
                f"{counts[longest]} tokens. Shorten it or split it.",
                param="input",
            )
        request_id = "embd-" + random_hex()
        engine_id = engine_request_id(request_id, client_request_id)
        generation = GenerationRequest(request_id=engine_id, prompt="", prompt_tokens=total, max_tokens=0,
                                       priority=priority, stream=False)  # fmt: skip
        return Call(
            request_id=request_id,
            tenant=tenant,
            alias=alias,
            endpoint="embeddings",
            stream=False,
            deployment=deployment,
            generation=generation,
            lane=chosen,
            task=task,
            end_user=user[:200] if user else None,
            client_request_id=client_request_id,
            embedding=EmbeddingRequest(
                request_id=engine_id, inputs=tuple(inputs), prompt_tokens=total, priority=priority
            ),
        )

    # ---- admission: everything taken is owned by one Lease ----
    def lease(self, call: Call) -> Lease:
        """Open the call's lease (no await: from here its owner's `finally` releases it)."""
        lease = Lease(self, call)
        self._leases.add(lease)
        self._leases_opened += 1
        self._idle.clear()
        call.deployment.outstanding += 1  # queued counts too: least-outstanding routing sees the backlog
        lease.holds_deployment = True
        return lease

    async def acquire(self, lease: Lease) -> None:
        """Reserve rate limit, pass admission, wait for an engine slot, each taken into the lease.
        A refusal, failure or cancellation is recorded as the call's outcome and re-raised; the
        lease's owner releases whatever was taken."""
        call = lease.call
        try:
            if self.draining:
                raise shutting_down()
            tokens = call.prompt_tokens + call.generation.n * call.generation.max_tokens
            with load_shedding.waiting_elsewhere():
                lease.reservation = await self._reserve(call, tokens)
            if self.draining:
                raise shutting_down()
            scheduler = self.scheduler(call.deployment)
            scheduler.admit(call.lane, call.tenant.id, call.tenant.weight)
            lease.ticket = Ticket(
                request_id=call.request_id,
                tenant_id=call.tenant.id,
                weight=call.tenant.weight,
                cost=tokens,
                lane=call.lane,
            )
            load_shedding.queued()  # from here it waits for the engine, not for this loop
            await scheduler.acquire(lease.ticket)
            call.dispatched_at = time.perf_counter()
        except BaseException as exc:
            call.fail(*self.outcome_of(exc))
            raise

    async def admit(self, call: Call) -> Lease:
        """lease() + acquire() for callers without an HTTP request (tests, benchmarks): the
        lease comes back admitted, or is released before the exception propagates."""
        lease = self.lease(call)
        try:
            await self.acquire(lease)
        except BaseException:
            lease.release()
            raise
        return lease

    async def _reserve(self, call: Call, tokens: int) -> Reservation:
        """The limiter's reserve, safe against cancellation: decided at once where the limiter
        can (nothing to cut), else over the network, where a reservation that completes after
        the client left is settled at once (nothing used) instead of leaking."""
        at_once = self.limiter.reserve_at_once(call.tenant, tokens, call.request_id)
        if at_once is not None:
            return at_once
        task = asyncio.ensure_future(self.limiter.reserve(call.tenant, tokens, call.request_id))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._settle_orphan)
            raise

    def _settle_orphan(self, task: asyncio.Future[Reservation]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.limiter.settle(task.result(), 0)

    def outcome_of(self, exc: BaseException) -> tuple[int, str]:
        """(status, code) for a request ended by `exc`, when nothing more specific was recorded."""
        if isinstance(exc, GatewayError):
            return exc.status, exc.code or "error"
        if isinstance(exc, asyncio.CancelledError | GeneratorExit):
            # Nobody said why: during a shutdown it is the server's doing, otherwise the client's.
            return (503, "shutting_down") if self.draining else (CLIENT_CLOSED, "client_disconnected")
        if isinstance(exc, EngineError):
            return 503, "engine_error"
        return 500, "internal_error"

    # ---- generation ----
    def run(self, lease: Lease) -> AsyncGenerator[Delta, None]:
        """Yield deltas with non-empty text, then one with finish_reason. The engine slot is
        given back as soon as the generation ends, however it ends."""
        assert lease.ticket is not None and lease.ticket.granted is not None, "admit() first"
        run = self._generate(lease)
        lease._run = run
        return run

    async def _generate(self, lease: Lease) -> AsyncGenerator[Delta, None]:
        call = lease.call
        deployment = call.deployment
        n = call.generation.n
        try:
            # Per choice: its stop matcher and how it ended. The run ends when every choice has.
            matchers = [StopMatcher(call.generation.stop) for _ in range(n)]
            reasons: list[FinishReason | None] = [None] * n
            left = n
            if call.trace is not None:  # the engine's own spans join the trace (an HTTP engine sends it)
                call.generation.trace_headers = call.trace.engine_started(call)
            engine_stream = deployment.engine.generate(call.generation)
            try:
                async for delta in engine_stream:
                    call.completion_tokens += delta.tokens  # what the engine computed is billed
                    if delta.prompt_tokens:
                        call.reported_prompt_tokens = delta.prompt_tokens
                    i = delta.index
                    if not 0 <= i < n or reasons[i] is not None:
                        continue  # a choice already cut at a stop: the rest of it is not sent
                    matcher = matchers[i]
                    text = matcher.feed(delta.text)
                    finish: FinishReason | None = None
                    if matcher.stopped:
                        finish = "stop"
                    elif delta.finish_reason is not None:
                        text += matcher.flush()
                        finish = delta.finish_reason
                    if (text or delta.tool_calls) and call.first_token_at is None:
                        call.first_token_at = time.perf_counter()
                    if finish is not None:
                        reasons[i], left = finish, left - 1
                        if left == 0:
                            call.finish_reason = reasons[0]
                            self.registry.record(deployment, ok=True)
                        yield Delta(text=text, tokens=0, finish_reason=finish, index=i,
                                    tool_calls=delta.tool_calls, logprobs=delta.logprobs)  # fmt: skip
                        if left == 0:
                            return
                    elif text or delta.tool_calls or delta.logprobs:
                        if text is delta.text and delta.prompt_tokens is None:
                            yield delta  # nothing held back or cut: the engine's own (no copy per chunk)
                        else:
                            yield Delta(text=text, tokens=delta.tokens, index=i,
                                        tool_calls=delta.tool_calls, logprobs=delta.logprobs)  # fmt: skip
                # An engine that ends without a reason ran out of tokens.
                for i in range(n):
                    if reasons[i] is None:
                        reasons[i] = "length"
                        call.finish_reason = reasons[0]
                        yield Delta(text=matchers[i].flush(), tokens=0, finish_reason="length", index=i)
                call.finish_reason = reasons[0]
            finally:
                await engine_stream.aclose()  # closing the engine stream is the cancellation
        except EngineRequestError as exc:  # the request's values, not the engine's health
            call.fail(400, "invalid_request")
            raise GatewayError(
                ErrorCode.INVALID_REQUEST, f"The engine serving '{call.alias}' refused the request: {exc}"
            ) from exc
        except EngineError as exc:
            raise self._engine_failed(call, exc) from exc
        except BaseException as exc:
            call.fail(*self.outcome_of(exc))
            raise
        finally:
            lease.end_generation()

    async def embed(self, lease: Lease) -> Embeddings:
        """The embeddings of an admitted call from prepare_embeddings(). The engine slot is given
        back as soon as it ends, however it ends (cancelling this await cancels the engine's work)."""
        assert lease.ticket is not None and lease.ticket.granted is not None, "admit() first"
        call = lease.call
        assert call.embedding is not None, "prepare_embeddings() first"
        deployment = call.deployment
        try:
            engine = embedder(deployment.engine)
            if engine is None:
                raise EngineError(f"deployment {deployment.spec.name} cannot embed")
            request = call.embedding
            if call.trace is not None:
                request = replace(request, trace_headers=call.trace.engine_started(call))
            result = await engine.embed(request)
            if result.vectors.shape[0] != len(call.embedding.inputs):
                raise EngineError(f"{result.vectors.shape[0]} vectors for {len(call.embedding.inputs)} inputs")
            if result.prompt_tokens:
                call.reported_prompt_tokens = result.prompt_tokens
            self.registry.record(deployment, ok=True)
            return result
        except EngineError as exc:
            raise self._engine_failed(call, exc) from exc
        except BaseException as exc:
            call.fail(*self.outcome_of(exc))
            raise
        finally:
            lease.end_generation()

    def _engine_failed(self, call: Call, exc: EngineError) -> GatewayError:
        """An engine fault: logged, counted against the deployment's health, 503 to the client."""
        log.error("engine error on %s (%s): %s", call.generation.request_id, call.deployment.spec.name, exc)
        self.registry.record(call.deployment, ok=False)
        call.fail(503, "engine_error")
        return GatewayError(ErrorCode.ENGINE_ERROR, f"The engine serving '{call.alias}' failed: {exc}", retry_after=1)

    # ---- bookkeeping ----
    def forget(self, lease: Lease) -> None:
        self._leases.discard(lease)
        if not self._leases:
            self._idle.set()

    @property
    def in_flight(self) -> int:
        """Requests holding a lease (queued or running) and not yet released."""
        return len(self._leases)

    @property
    def leases_opened(self) -> int:
        """Leases ever opened: each one leaves exactly one usage row when released."""
        return self._leases_opened

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run cleanup work in the background, kept referenced until it ends."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, timeout_s: float, *, cut_grace_s: float = 2.0) -> None:
        """Shutdown: stop admitting (503 shutting_down), refuse every queued request the same way,
        let running ones finish for up to timeout_s, then interrupt them (an error event for a
        stream) and wait for each to release its lease (its usage row is then queued)."""
        self.draining = True
        for scheduler in list(self._schedulers.values()):
            scheduler.reject_waiting(shutting_down)
        if self._leases:
            log.info("draining %d requests for up to %.0f s", len(self._leases), timeout_s)
            try:
                async with asyncio.timeout(timeout_s):
                    await self._idle.wait()
            except TimeoutError:
                log.warning("cutting %d requests still running after %.0f s", len(self._leases), timeout_s)
                for lease in list(self._leases):
                    lease.interrupt(shutting_down())
                try:
                    async with asyncio.timeout(cut_grace_s):
                        await self._idle.wait()
                except TimeoutError:
                    log.error("%d requests did not end after being cut; releasing them", len(self._leases))
                    for lease in list(self._leases):
                        lease.release()
        while self._background:
            await asyncio.wait(set(self._background))

    def account(self, call: Call) -> None:
        """The usage row and metrics of a finished request (once, from Lease.release)."""
        now = time.perf_counter()
        self.metrics.observe(call, now)
        self.recorder.record(
            {
                "request_id": call.public_id,
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
