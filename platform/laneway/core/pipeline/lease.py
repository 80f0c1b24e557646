"""The Lease: everything an admitted request holds, released in one place."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline.call import Call
from laneway.core.ratelimit import Reservation
from laneway.core.scheduler import Ticket


class LeaseOwner(Protocol):
    """What a lease gives back its resources to (the Gateway)."""

    def release_slot(self, call: Call, ticket: Ticket | None, placement: Ticket | None) -> None: ...
    def settle(self, reservation: Reservation, tokens: int, cost: int = 0) -> None: ...
    def account(self, call: Call) -> None: ...
    def forget(self, lease: Lease) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


@dataclass(eq=False)
class Lease:
    """Everything an admitted request holds: the deployment's outstanding count, the rate-limit
    reservation (with its concurrency holder) and the engine slot. release() is the only
    release of any of them; it never awaits, so no cancellation can stop it half-way."""

    owner: LeaseOwner
    call: Call
    reservation: Reservation | None = None
    ticket: Ticket | None = None  # the replica's slot
    # Waiting for any replica of the alias, then bound to one (core/dispatch/): its place there.
    placement: Ticket | None = None
    late: bool = False
    holds_deployment: bool = False
    released: bool = False
    # How to end the generation early (shutdown): set by whoever is running it.
    interrupter: Callable[[GatewayError], None] | None = None
    # How to stop a generation that a task of its own runs (a stream's pump): a stream released
    # before its body was ever sent would otherwise generate on for nobody.
    stop_run: Callable[[], None] | None = None
    _run: Any = None  # the run() async generator (its ag_frame / ag_running tell its state)
    _generation_ended: bool = False

    def end_generation(self) -> None:
        """Give back the engine slot and the outstanding count (idempotent)."""
        if self._generation_ended:
            return
        self._generation_ended = True
        call = self.call
        if call.trace is not None:
            call.trace.engine_ended(call)
        if call.latency is not None:  # what its replica's latency model learns from (core/latency/)
            call.latency.end(
                call.prompt_tokens, call.completion_tokens // call.generation.n, call.finish_reason is not None
            )
        if self.holds_deployment:
            self.call.deployment.outstanding -= 1
        if self.ticket is not None or self.placement is not None:
            self.owner.release_slot(self.call, self.ticket, self.placement)

    def reopen_generation(self) -> None:
        """The call moved to another replica (failover): its next end gives that one back."""
        self._generation_ended = False
        self.holds_deployment = True

    def interrupt(self, error: GatewayError) -> None:
        """End this request early with `error` (shutdown): the client gets it as an error event
        (stream) or an error response; the engine stops."""
        self.call.fail(error.code)
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
            self.owner.spawn(self._close_run(run))
        elif self.stop_run is not None:  # a pump runs it: stopping the pump ends the generation
            self.stop_run()
        # else: run() is executing right now, and its own `finally` ends the generation.
        call = self.call
        if self.reservation is not None:
            # A preempted line gives its tokens back: its rerun counts them against the limits.
            used = 0 if call.error_code is ErrorCode.PREEMPTED else call.prompt_tokens + call.completion_tokens
            self.owner.settle(self.reservation, used, call.cost_micros or 0)
        self.owner.account(call)
        if call.trace is not None:  # the request span ends with the request, whatever ended it
            call.trace.finish(call)
        self.owner.forget(self)

    async def _close_run(self, run: Any) -> None:
        try:
            await run.aclose()
        finally:
            self.end_generation()
