"""The Gateway: the pipeline's one entry, and the owner of every lease it opens.

  serve(tenant, intent, client)   the entry the API calls, in this order:
    prepare   resolve -> measure -> policy (max_tokens, stops) -> route (lane)   no waiting
    lease     open the request's Lease (no await)                                owned from here
    acquire   rate limit (reserve) -> admission -> schedule (wait for a slot)    may refuse
    run       generate, enforcing stops (embed for embeddings)
  Lease.release()  the only release: engine slot, outstanding, rate-limit reservation
             (settled with the tokens actually used), then the outcome to the sinks. Idempotent.

A non-streaming request is answered whole (Completed, Embedded) and its lease released here.
A stream comes back admitted (Streaming): its lease then belongs to the response that sends
it, which releases it when the stream ends. The outcome is classified once, by whoever first
knows it (`Call.fail`, given an ErrorCode: the status is the code's): the client leaving, or
reading too slowly, is 499; an engine fault, a dependency or a shutdown is 503 (500 for a
bug), with its own code, never mistaken for 499.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar, overload

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, shutting_down
from laneway.core import load_shedding
from laneway.core.canary.swaps import Swaps
from laneway.core.dispatch import ReplicaFigures
from laneway.core.latency import LatencyReadings
from laneway.core.pipeline.answers import Client, Completed, Embedded, Streaming
from laneway.core.pipeline.attempts import run_attempts
from laneway.core.pipeline.call import Call
from laneway.core.pipeline.config import GatewayConfig
from laneway.core.pipeline.failover import Failover, RetryBudget, StallRule
from laneway.core.pipeline.generate import embed_call
from laneway.core.pipeline.intent import EmbeddingIntent, GenerationIntent, Intent
from laneway.core.pipeline.lease import Lease
from laneway.core.pipeline.outcome import Outcome, OutcomeSink
from laneway.core.pipeline.prepare import Preparer
from laneway.core.pipeline.waiting import DryRun, Scheduler, Waiting
from laneway.core.policy import PolicyStore
from laneway.core.ratelimit import MemoryRateLimiter, RateLimiter, Reservation
from laneway.core.scheduler import Ticket
from laneway.core.shared_slots import SharedSlots
from laneway.engines.base import EngineError
from laneway.engines.registry import EngineRegistry, LiveDeployment
from laneway.types import Delta, Embeddings, TenantSnapshot

log = logging.getLogger("laneway.pipeline")
T = TypeVar("T")


class Gateway:
    def __init__(
        self,
        registry: EngineRegistry,
        policies: PolicyStore,
        limiter: RateLimiter | None = None,
        *,
        config: GatewayConfig | None = None,
        sinks: Sequence[OutcomeSink] = (),
        shared_slots: SharedSlots | None = None,
    ) -> None:
        """`config`: the tuning (core/pipeline/config.py); `sinks` take each finished request's
        outcome; `shared_slots` shares remote engines' slots with other gateway replicas."""
        config = config or GatewayConfig()
        self.registry = registry
        self.shared_slots = shared_slots
        self.policies = policies
        self.limiter: RateLimiter = limiter or MemoryRateLimiter()
        # Engine swaps (core/canary/): the canary watch reads every outcome, beside the sinks.
        self.swaps = Swaps(registry, config.canary_margins, config.shadow_concurrency)
        self.sinks = (*sinks, self.swaps.watch)
        self.preparer = Preparer(registry, policies, default_max_tokens=config.default_max_tokens)
        budget = RetryBudget(config.retry_ratio, config.retry_minimum, config.retry_window_s)
        stall = StallRule(config.stall_multiple, config.stall_floor_s)
        self.failover = Failover(
            registry, max_tries=config.max_tries, budget=budget, continuation=config.continuation, stall=stall
        )
        self.waiting = Waiting(
            registry,
            shared_slots=shared_slots,
            routing=config.routing,
            routing_params=config.routing_params,
            admit_by_prediction=config.admit_by_prediction,
            quantum=config.quantum,
            starvation_share=config.starvation_share,
            headroom=config.headroom,
            background_reserve=config.background_reserve,
        )
        self._background: set[asyncio.Task[Any]] = set()
        self._leases: set[Lease] = set()  # opened and not yet released
        self._leases_opened = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False  # shutdown has begun: no new admissions

    # ---- the entry ----
    @overload
    async def serve(
        self, tenant: TenantSnapshot, intent: GenerationIntent, client: Client
    ) -> Completed | Streaming: ...
    @overload
    async def serve(self, tenant: TenantSnapshot, intent: EmbeddingIntent, client: Client) -> Embedded: ...
    async def serve(self, tenant: TenantSnapshot, intent: Intent, client: Client) -> Completed | Embedded | Streaming:
        call = await self.prepare(tenant, intent) if isinstance(intent, GenerationIntent) else None
        if call is None:
            assert isinstance(intent, EmbeddingIntent)
            call = await self.prepare_embeddings(tenant, intent)
        lease = self.lease(call)  # opened before the next await: this `finally` or the stream releases it
        client.bound(call)
        owned = True
        try:
            if call.embedding is not None:
                result = await client.watch(self._admitted(lease, lambda: self.embed(lease)), call)
                return Embedded(call, result)
            if not call.stream:
                deltas = await client.watch(self._admitted(lease, lambda: self._collect(lease)), call)
                return Completed(call, deltas)
            await client.watch(self.acquire(lease), call)
            stream = Streaming(lease, self)
            await client.watch(stream.start(), call)  # no status line before the first token
            owned = False  # the stream's owner releases it when the stream ends
            return stream
        except BaseException as exc:
            call.fail(self.outcome_of(exc))
            raise
        finally:
            if owned:
                lease.release()

    async def _collect(self, lease: Lease) -> list[Delta]:
        return [d async for d in self.run(lease)]

    async def _admitted(self, lease: Lease, work: Callable[[], Awaitable[T]]) -> T:
        """Wait for a slot, then do `work`, in this task: an interruption (a shutdown) cancels it
        and surfaces as the interrupting error."""
        current = asyncio.current_task()
        assert current is not None
        interrupted: list[GatewayError] = []

        def interrupt(error: GatewayError) -> None:
            interrupted.append(error)
            current.cancel()

        lease.interrupter = interrupt
        try:
            await self.acquire(lease)
            return await work()
        except asyncio.CancelledError:
            if interrupted and current.cancelling():
                current.uncancel()
                raise interrupted[0] from None
            raise
        finally:
            lease.interrupter = None

    # ---- the stages, each usable alone (tests, benchmarks) ----
    async def prepare(self, tenant: TenantSnapshot, intent: GenerationIntent) -> Call:
        return await self.preparer.serving(tenant, intent, self._can_take)

    def _can_take(self, call: Call) -> bool:
        """Whether the call's replica is healthy and its queue admits it (the admission check
        is then not made again)."""
        if not call.deployment.healthy:
            return False
        try:
            self.waiting.admit(call, self.waiting.late(call))
        except GatewayError:
            return False
        call.admission_checked = True
        return True

    async def prepare_embeddings(self, tenant: TenantSnapshot, intent: EmbeddingIntent) -> Call:
        return await self.preparer.embeddings(tenant, intent)

    def lease(self, call: Call) -> Lease:
        """Open the call's lease (no await: from here its owner's `finally` releases it)."""
        lease = Lease(self, call, late=self.waiting.late(call))
        self._leases.add(lease)
        self._leases_opened += 1
        self._idle.clear()
        if not lease.late:  # bound now: queued counts too, so least-outstanding routing sees the backlog
            self.waiting.bind_early(call)
            call.deployment.outstanding += 1
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
            if not call.admission_checked:
                self.waiting.admit(call, lease.late)
            load_shedding.queued()  # from here it waits for the engine, not for this loop
            await self.waiting.acquire(lease, tokens)
        except BaseException as exc:
            call.fail(self.outcome_of(exc))
            raise

    async def admit(self, call: Call) -> Lease:
        """lease() + acquire() for callers without a client (tests, benchmarks): the lease comes
        back admitted, or is released before the exception propagates."""
        lease = self.lease(call)
        try:
            await self.acquire(lease)
        except BaseException:
            lease.release()
            raise
        return lease

    def run(self, lease: Lease) -> AsyncGenerator[Delta, None]:
        """The admitted lease's deltas (core/pipeline/generate.py), started again on another
        replica if its own fails before the first delta (core/pipeline/failover.py), continued
        on another if it fails mid-answer (core/pipeline/continuation.py)."""
        assert lease.ticket is not None and lease.ticket.granted is not None, "admit() first"
        self.failover.budget.requested(lease.call.deployment.spec.name)
        run = run_attempts(lease, self.registry, self.failover, self.waiting, self.outcome_of)
        call = lease.call
        shadow = self.swaps.shadows.sampled(call.alias)
        if shadow is not None:  # its copy runs on the shadow once this answer is whole
            run = self.swaps.shadows.recorded(run, shadow, call.generation, lambda: _engine_ttft(call))
        lease._run = run
        return run

    async def embed(self, lease: Lease) -> Embeddings:
        assert lease.ticket is not None and lease.ticket.granted is not None, "admit() first"
        return await embed_call(lease, self.registry, self.outcome_of)

    async def _reserve(self, call: Call, tokens: int) -> Reservation:
        """The limiter's reserve, safe against cancellation: decided at once where the limiter
        can (nothing to cut), else over the network, where a reservation that completes after
        the client left is settled at once (nothing used) instead of leaking."""
        # The money budgets reserve its most cost: prompt + n x max_tokens at its price.
        cost = 0 if call.price is None else call.price.most(call.prompt_tokens, tokens - call.prompt_tokens)
        at_once = self.limiter.reserve_at_once(call.tenant, tokens, call.request_id, cost)
        if at_once is not None:
            return at_once
        task = asyncio.ensure_future(self.limiter.reserve(call.tenant, tokens, call.request_id, cost))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._settle_orphan)
            raise

    def _settle_orphan(self, task: asyncio.Future[Reservation]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.limiter.settle(task.result(), 0)

    def outcome_of(self, exc: BaseException) -> ErrorCode:
        """The code of a request ended by `exc`, when nothing more specific was recorded."""
        if isinstance(exc, GatewayError):
            return exc.code
        if isinstance(exc, asyncio.CancelledError | GeneratorExit):
            # Nobody said why: during a shutdown it is the server's doing, otherwise the client's.
            return ErrorCode.SHUTTING_DOWN if self.draining else ErrorCode.CLIENT_DISCONNECTED
        if isinstance(exc, EngineError):
            return ErrorCode.ENGINE_ERROR
        return ErrorCode.INTERNAL_ERROR

    # ---- what a lease gives back (LeaseOwner) ----
    def release_slot(self, call: Call, ticket: Ticket | None, placement: Ticket | None) -> None:
        self.waiting.release(call, ticket, placement)

    def settle(self, reservation: Reservation, tokens: int, cost: int = 0) -> None:
        self.limiter.settle(reservation, tokens, cost)

    def account(self, call: Call) -> None:
        """The outcome of a finished request, to every sink (once, from Lease.release)."""
        outcome = Outcome.of(call, time.perf_counter())
        for sink in self.sinks:
            sink.finished(outcome)

    def forget(self, lease: Lease) -> None:
        self._leases.discard(lease)
        if not self._leases:
            self._idle.set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run cleanup work in the background, kept referenced until it ends."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- what the runtime and the admin read, without reaching into the stages ----
    @property
    def default_max_tokens(self) -> int:
        """prepare's max_tokens when neither the request nor its task sets one."""
        return self.preparer.default_max_tokens

    async def dry_run(self, tenant: TenantSnapshot, intent: GenerationIntent) -> DryRun:
        """What serve() would decide for `intent` now, running none of it (the admin's route
        tester): the pipeline's own prepare, a fallback chosen for an unhealthy replica as
        serving would (whether its queue admits it depends on the moment: not asked), then the
        replicas dispatch would weigh and its choice. No limit, queue or index is touched."""
        call = await self.preparer.serving(tenant, intent, lambda c: c.deployment.healthy)
        return self.waiting.dry_run(call)

    def replicas_changed(self) -> None:
        """The replicas or the policies changed (a reload, a health check that brought one back):
        the aliases' queues are dispatched again at once, not at the next release."""
        self.waiting.kick()

    def replica_figures(self) -> dict[str, ReplicaFigures]:
        """Per replica: what dispatch placed there since start (the admin's models page)."""
        return self.waiting.replica_figures()

    def latency_readings(self) -> dict[str, LatencyReadings]:
        """Per replica: what its latency model has learned (core/latency/)."""
        return self.waiting.latency.readings()

    # ---- the deployments' queues ----
    def capabilities(self, alias: str) -> frozenset[str]:
        return self.registry.capabilities(alias)

    def visible_models(self, tenant: TenantSnapshot) -> list[str]:
        return [a for a in self.registry.aliases() if tenant.may_use(a)]

    def scheduler(self, deployment: LiveDeployment) -> Scheduler:
        """The deployment's own scheduler (core/pipeline/waiting.py)."""
        return self.waiting.scheduler(deployment)

    def queue_stats(self) -> list[tuple[dict[str, str], int, int]]:
        """Waiting and running requests per deployment and lane (core/pipeline/waiting.py)."""
        return self.waiting.stats(self.policies.current.lanes)

    @property
    def in_flight(self) -> int:
        """Requests holding a lease (queued or running) and not yet released."""
        return len(self._leases)

    @property
    def leases_opened(self) -> int:
        """Leases ever opened: each one leaves exactly one usage row when released."""
        return self._leases_opened

    async def drain(self, timeout_s: float, *, cut_grace_s: float = 2.0) -> None:
        """Shutdown: stop admitting (503 shutting_down), refuse every queued request the same way,
        let running ones finish for up to timeout_s, then interrupt them (an error event for a
        stream) and wait for each to release its lease (its usage row is then queued)."""
        self.draining = True
        self.waiting.reject_waiting(shutting_down)
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
        await self.swaps.close()  # shadow copies are nobody's answer: not waited for


def _engine_ttft(call: Call) -> float | None:
    """The served engine's own time to its first token (from its slot): what a shadow's is compared with."""
    if call.first_token_at is None or call.dispatched_at is None:
        return None
    return call.first_token_at - call.dispatched_at
