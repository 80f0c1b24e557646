"""generate: the engine's deltas, with stops enforced and the engine slot given back as soon
as the generation ends, however it ends. Embeddings take the same path without deltas."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.early_stops import AnswerStops
from laneway.core.pipeline.call import Call
from laneway.core.pipeline.failover import EarlyEngineFailure, FirstTokenTimeout, failure_reason
from laneway.core.pipeline.lease import Lease
from laneway.core.stops import StopMatcher
from laneway.engines.base import EngineError, EngineRequestError, embedder
from laneway.engines.registry import EngineRegistry
from laneway.types import Delta, Embeddings, FinishReason

log = logging.getLogger("laneway.pipeline")
OutcomeOf = Callable[[BaseException], ErrorCode]


async def generate_deltas(lease: Lease, registry: EngineRegistry, outcome_of: OutcomeOf) -> AsyncGenerator[Delta, None]:
    """Yield deltas with non-empty text, then one with finish_reason per choice. An engine
    failure before anything reached the client (a stream: before the first delta was yielded;
    a whole answer: before it is complete, the caller holding its deltas back) is raised as
    EarlyEngineFailure, for the caller to try another replica (core/pipeline/failover.py);
    after it, as a 503 GatewayError."""
    call = lease.call
    deployment = call.deployment
    n = call.generation.n
    first_token_timeout = deployment.spec.config.get("first_token_timeout_s")
    yielded = False
    try:
        # Per choice: its stop matcher and how it ended. The run ends when every choice has.
        ext = call.generation.extensions
        keep = bool(ext is not None and ext.include_stop_str_in_output)
        matchers = [StopMatcher(call.generation.stop, keep_stop=keep) for _ in range(n)]
        # min_tokens: stops are not looked for in a choice's first tokens (as vLLM does).
        unstoppable = (ext.min_tokens or 0) if ext is not None and call.generation.stop else 0
        produced = [0] * n
        # The task's early stop per choice (core/early_stops.py), read on the text the stop
        # strings let through; this attempt's alone (a failover starts the answer again).
        early = AnswerStops(call.early_rule, n) if call.early_rule is not None else None
        call.early_stop, call.tokens_saved, call.stop_sequence = None, 0, None
        reasons: list[FinishReason | None] = [None] * n
        left = n
        if call.trace is not None:  # the engine's own spans join the trace (an HTTP engine sends it)
            call.generation.trace_headers = call.trace.engine_started(call)
        engine_stream = deployment.engine.generate(call.generation)
        source: AsyncGenerator[Delta, None] = engine_stream
        if first_token_timeout:
            source = _first_within(engine_stream, float(first_token_timeout), lambda: yielded)
        try:
            async for delta in source:
                call.completion_tokens += delta.tokens  # what the engine computed is billed
                if delta.prompt_tokens:
                    call.reported_prompt_tokens = delta.prompt_tokens
                i = delta.index
                if not 0 <= i < n:
                    continue
                produced[i] += delta.tokens
                if reasons[i] is not None:  # a choice already cut at a stop: the rest of it is not sent
                    if early is not None and delta.finish_reason is not None:
                        early.engine_ended(i)
                    continue
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
                if finish is not None:
                    reasons[i], left = finish, left - 1
                    if left == 0:
                        call.finish_reason = reasons[0]
                        registry.record(deployment, ok=True)
                        if early is not None and early.stopped:
                            call.tokens_saved = early.saved(call.generation.max_tokens, produced)
                    yielded = True
                    yield Delta(
                        text=text,
                        tokens=0,
                        finish_reason=finish,
                        index=i,
                        tool_calls=delta.tool_calls,
                        logprobs=delta.logprobs,
                    )
                    if left == 0:
                        return
                elif text or delta.tool_calls or delta.logprobs:
                    yielded = True
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
            for i in range(n):
                if reasons[i] is None:
                    reasons[i] = "length"
                    call.finish_reason = reasons[0]
                    yield Delta(text=matchers[i].flush(), tokens=0, finish_reason="length", index=i)
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
        if not yielded or not call.stream:  # nothing reached the client: another replica may serve it
            raise EarlyEngineFailure(exc, failure_reason(exc)) from exc
        raise engine_failed(call, exc, registry) from exc
    except BaseException as exc:
        call.fail(outcome_of(exc))
        raise
    finally:
        lease.end_generation()


async def _first_within(
    stream: AsyncIterator[Delta], timeout_s: float, started: Callable[[], bool]
) -> AsyncGenerator[Delta, None]:
    """The engine's deltas, the wait for each bounded by `timeout_s` until `started()` (the
    first delta reached the consumer): a replica stuck before its first token has failed."""
    iterator = aiter(stream)
    while True:
        try:
            if started():
                delta = await anext(iterator)
            else:
                async with asyncio.timeout(timeout_s):
                    delta = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise FirstTokenTimeout(f"no first token within {timeout_s:g} s") from None
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
