"""generate: the engine's deltas, with stops enforced and the engine slot given back as soon
as the generation ends, however it ends (one attempt: core/pipeline/attempts.py runs them).
Embeddings take the same path without deltas."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline.call import Call
from laneway.core.pipeline.continuation import Answer, LateEngineFailure
from laneway.core.pipeline.failover import (
    EarlyEngineFailure,
    FirstTokenTimeout,
    InterTokenTimeout,
    StallRule,
    failure_reason,
)
from laneway.core.pipeline.lease import Lease
from laneway.engines.base import EngineError, EngineRequestError, embedder
from laneway.engines.registry import EngineRegistry
from laneway.types import Delta, Embeddings, FinishReason

log = logging.getLogger("laneway.pipeline")
OutcomeOf = Callable[[BaseException], ErrorCode]


async def generate_deltas(
    lease: Lease, registry: EngineRegistry, outcome_of: OutcomeOf, answer: Answer, stall: StallRule | None = None
) -> AsyncGenerator[Delta, None]:
    """One attempt at the call's answer on its replica: yield deltas with non-empty text, then
    one with finish_reason per choice. `answer` carries what earlier attempts built (the stops'
    state, the tokens, the text; core/pipeline/continuation.py). An engine failure before
    anything reached the consumer is raised as EarlyEngineFailure (the answer may start again
    on another replica: core/pipeline/failover.py), after it as LateEngineFailure (it may
    continue on another). `stall`: where the deployment sets no inter_token_timeout_s, the rule
    that tells a stalled replica from the learned inter-token time."""
    call = lease.call
    deployment = call.deployment
    config = deployment.spec.config
    first_token_timeout = config.get("first_token_timeout_s")
    inter_token_timeout = config.get("inter_token_timeout_s")
    n = call.generation.n
    try:
        matchers, produced, reasons, early = answer.matchers, answer.produced, answer.reasons, answer.early
        unstoppable = answer.unstoppable
        if not answer.continuations:
            call.early_stop, call.tokens_saved, call.stop_sequence = None, 0, None
        request = answer.request
        if call.trace is not None:  # the engine's own spans join the trace (an HTTP engine sends it)
            request.trace_headers = call.trace.engine_started(call)
        engine_stream = deployment.engine.generate(request)
        source: AsyncGenerator[Delta, None] = engine_stream
        learned = None
        if not inter_token_timeout and stall is not None and stall.limit(call.latency) is not None:
            learned = lambda: stall.limit(call.latency)  # noqa: E731  # the attempt's, when asked
        if first_token_timeout or inter_token_timeout or learned is not None:
            source = _paced(engine_stream, first_token_timeout, inter_token_timeout, learned)
        try:
            async for delta in source:
                call.completion_tokens += delta.tokens  # what the engine computed is billed
                if delta.prompt_tokens:
                    answer.prefilled(call, delta.prompt_tokens)
                i = delta.index
                if not 0 <= i < n:
                    continue
                produced[i] += delta.tokens
                if reasons[i] is not None:  # a choice already cut at a stop: the rest of it is not sent
                    if early is not None and delta.finish_reason is not None:
                        early.engine_ended(i)
                    continue
                if i == 0:
                    answer.generated.append(delta.text)
                matcher = matchers[i]
                if unstoppable:
                    text = delta.text if produced[i] <= unstoppable else matcher.feed(delta.text)
                else:
                    text = matcher.feed(delta.text)
                finish: FinishReason | None = None
                if matcher.stopped:
                    finish = "stop"
                    if i == 0:
                        call.stop_sequence = matcher.matched
                elif delta.finish_reason is not None:
                    text += matcher.flush()
                    finish = delta.finish_reason
                elif early is not None and text and (cut := early.cut(i, text)) is not None:
                    # Done though the engine goes on: the rest of the delta is dropped, and
                    # the engine is cancelled below once every choice has ended.
                    text, finish = text[:cut], "stop"
                    call.early_stop = early.reason
                if (text or delta.tool_calls) and call.first_token_at is None:
                    call.first_token_at = time.perf_counter()
                    if call.latency is not None:
                        call.latency.first_token(call.first_token_at)
                if delta.tool_calls:
                    answer.tool_calls = True
                if finish is not None:
                    reasons[i] = finish
                    answer.left -= 1
                    if answer.left == 0:
                        call.finish_reason = reasons[0]
                        registry.record(deployment, ok=True)
                        if early is not None and early.stopped:
                            call.tokens_saved = early.saved(call.generation.max_tokens, produced)
                    answer.relayed = True
                    answer.seam_closed(call)
                    yield Delta(
                        text=text,
                        tokens=0,
                        finish_reason=finish,
                        index=i,
                        tool_calls=delta.tool_calls,
                        logprobs=delta.logprobs,
                    )
                    if answer.left == 0:
                        return
                elif text or delta.tool_calls or delta.logprobs:
                    answer.relayed = True
                    if answer.seam_from is not None:
                        answer.seam_closed(call)
                    if text is delta.text and delta.prompt_tokens is None:
                        yield delta  # nothing held back or cut: the engine's own (no copy per chunk)
                    else:
                        yield Delta(
                            text=text,
                            tokens=delta.tokens,
                            index=i,
                            tool_calls=delta.tool_calls,
                            logprobs=delta.logprobs,
                        )
            # An engine that ends without a reason ran out of tokens.
            for last in answer.at_length():
                call.finish_reason = reasons[0]
                yield last
            call.finish_reason = reasons[0]
        finally:
            if source is not engine_stream:
                await source.aclose()
            await engine_stream.aclose()  # closing the engine stream is the cancellation
    except EngineRequestError as exc:  # the request's values, not the engine's health
        call.fail(ErrorCode.INVALID_REQUEST)
        raise GatewayError(
            ErrorCode.INVALID_REQUEST, f"The engine serving '{call.alias}' refused the request: {exc}"
        ) from exc
    except EngineError as exc:
        if not answer.relayed:  # nothing reached the consumer: another replica may start it again
            raise EarlyEngineFailure(exc, failure_reason(exc)) from exc
        raise LateEngineFailure(exc, failure_reason(exc)) from exc
    except BaseException as exc:
        call.fail(outcome_of(exc))
        raise
    finally:
        lease.end_generation()


# How many deltas a learned stall limit holds before it is asked again (the batch the replica
# runs, and so its step, changes; asking per delta would cost the stream's hot path).
LEARNED_LIMIT_DELTAS = 64


async def _paced(
    stream: AsyncIterator[Delta],
    first_s: float | None,
    inter_s: float | None,
    learned: Callable[[], float | None] | None = None,
) -> AsyncGenerator[Delta, None]:
    """The engine's deltas, the wait for the first one with text bounded by `first_s` and each
    after it by `inter_s`, or without it by `learned()` (core/pipeline/failover.py's StallRule;
    None: unbounded): a replica stuck before its first token, or stalled mid-answer, has failed."""
    iterator = aiter(stream)
    began = False
    learning = not inter_s and learned is not None
    asked_in = 0  # deltas until the learned limit is asked again
    while True:
        if began and learning:
            if asked_in == 0:
                inter_s, asked_in = learned() if learned is not None else None, LEARNED_LIMIT_DELTAS
            asked_in -= 1
        limit = float((inter_s if began else first_s) or 0)
        try:
            if limit:
                async with asyncio.timeout(limit):
                    delta = await anext(iterator)
            else:
                delta = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if began:
                how = " (learned from its inter-token time)" if learning else ""
                raise InterTokenTimeout(f"no token within {limit:.3g} s{how}") from None
            raise FirstTokenTimeout(f"no first token within {limit:g} s") from None
        began = began or bool(delta.text or delta.tool_calls)
        yield delta


async def embed_call(lease: Lease, registry: EngineRegistry, outcome_of: OutcomeOf) -> Embeddings:
    """The embeddings of an admitted embeddings call (cancelling this await cancels the
    engine's work)."""
    call = lease.call
    assert call.embedding is not None, "an embeddings call comes from Preparer.embeddings()"
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
        registry.record(deployment, ok=True)
        return result
    except EngineError as exc:
        raise engine_failed(call, exc, registry) from exc
    except BaseException as exc:
        call.fail(outcome_of(exc))
        raise
    finally:
        lease.end_generation()


def engine_failed(call: Call, exc: EngineError, registry: EngineRegistry) -> GatewayError:
    """An engine fault: logged, counted against the deployment's health, 503 to the client."""
    log.error("engine error on %s (%s): %s", call.generation.request_id, call.deployment.spec.name, exc)
    registry.record(call.deployment, ok=False)
    call.fail(ErrorCode.ENGINE_ERROR)
    return GatewayError(ErrorCode.ENGINE_ERROR, f"The engine serving '{call.alias}' failed: {exc}", retry_after=1)
