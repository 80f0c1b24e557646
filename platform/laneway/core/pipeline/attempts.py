"""A call's attempts, one replica after another, until its answer is whole or its failure final.

  a replica fails before anything reached the consumer   -> start again on another (failover.py)
  a replica fails mid-answer                             -> continue on another (continuation.py),
                                                            or, if it cannot, end with the error
                                                            (a stream: an error event)

A whole (non-streamed) answer is held until complete, so nothing of it reached the client
when its replica fails: it continues where it can (the engine computes less, the client
waits less), and otherwise starts again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

from laneway.contracts.errors import GatewayError
from laneway.core.pipeline.call import Call
from laneway.core.pipeline.continuation import Answer, LateEngineFailure
from laneway.core.pipeline.failover import EarlyEngineFailure, Failover
from laneway.core.pipeline.generate import OutcomeOf, engine_failed, generate_deltas
from laneway.core.pipeline.lease import Lease
from laneway.core.pipeline.waiting import Waiting
from laneway.engines.base import EngineError
from laneway.engines.registry import EngineRegistry, LiveDeployment
from laneway.types import Delta

log = logging.getLogger("laneway.pipeline")


async def run_attempts(
    lease: Lease, registry: EngineRegistry, failover: Failover, waiting: Waiting, outcome_of: OutcomeOf
) -> AsyncGenerator[Delta, None]:
    call = lease.call
    answer = Answer(call)
    held: list[Delta] = []  # a whole answer's deltas, until it is complete
    try:
        while True:
            target: LiveDeployment | None = None
            attempt = generate_deltas(lease, registry, outcome_of, answer, failover.stall)
            try:
                async for delta in attempt:
                    if call.stream:
                        yield delta
                    else:
                        held.append(delta)
                for delta in held:
                    yield delta
                return
            except EarlyEngineFailure as failure:
                target = failover.next_replica(call, failure.reason)
                if target is None:
                    raise engine_failed(call, failure.error, registry) from failure.error
                registry.record(call.deployment, ok=False)
                _moving(call.deployment, target, call.generation.request_id, failure.reason, "before its first token")
                answer, held = _start_again(lease), []
            except LateEngineFailure as failure:
                if answer.exhausted(call):  # it failed with the last token it was allowed: the answer is whole
                    registry.record(call.deployment, ok=False)
                    held.extend(answer.at_length())
                    call.finish_reason = answer.reasons[0]
                    for delta in held:
                        yield delta
                    return
                why = answer.refusal(call) if failover.continuation else "continuation is off"
                if why is None:
                    target = failover.next_replica(call, failure.reason, continued=True, suitable=Answer.suitable(call))
                    why = _why_not(failover, call) if target is None else None
                elif not call.stream:  # nothing was sent: it may still start again elsewhere
                    target = failover.next_replica(call, failure.reason)
                if target is None:
                    log.warning("%s not continued: %s", call.generation.request_id, why)
                    error = EngineError(f"{failure.error} (mid-answer; not continued: {why})")
                    raise engine_failed(call, error, registry) from failure.error
                registry.record(call.deployment, ok=False)
                if why is None:
                    _moving(call.deployment, target, call.generation.request_id, failure.reason, "mid-answer")
                    call.deployment.continued += 1
                    answer.continue_on(call)
                else:
                    _moving(call.deployment, target, call.generation.request_id, failure.reason, "mid-answer, again")
                    answer, held = _start_again(lease), []
            finally:
                await attempt.aclose()  # at once: closing it cancels the engine's work
            assert target is not None  # every path that did not end the call chose one
            await waiting.rebind(lease, target)
            failover.budget.requested(target.spec.name)
    except BaseException as exc:
        call.fail(outcome_of(exc))
        if isinstance(exc, GatewayError):
            waiting.overloaded_retry(exc, call)
        raise
    finally:
        lease.end_generation()


def _start_again(lease: Lease) -> Answer:
    """A fresh answer: what the failed replica computed is not the client's to pay."""
    call = lease.call
    call.completion_tokens, call.reported_prompt_tokens, call.first_token_at = 0, None, None
    return Answer(call)


def _why_not(failover: Failover, call: Call) -> str:
    if call.retry_denied == "budget":
        return "the retry budget is spent"
    if len(call.failed_tries) >= failover.max_tries:
        return f"its {failover.max_tries} tries are spent"
    return "no other replica can continue it"


def _moving(failed: LiveDeployment, target: LiveDeployment, request_id: str, reason: str, when: str) -> None:
    log.warning("%s failed %s %s (%s); trying %s", failed.spec.name, request_id, when, reason, target.spec.name)
