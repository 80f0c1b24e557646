"""The request pipeline after auth: resolve -> measure -> policy -> generate -> account.

The HTTP layer builds a Call with Gateway.prepare() (which raises GatewayError for anything
the client did wrong), then drains Gateway.run(call). run() enforces stop sequences, keeps
usage and timings on the Call, closes the engine stream on every exit (that is the
cancellation), and hands one usage row to the recorder.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from laneway.core.accounting import UsageRecorder
from laneway.core.errors import GatewayError
from laneway.core.stops import StopMatcher
from laneway.engines.base import EngineError
from laneway.engines.registry import EngineRegistry, LiveDeployment, UnknownModel
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
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    completion_tokens: int = 0
    finish_reason: FinishReason | None = None
    status: int = 200
    error_code: str | None = None
    end_user: str | None = None  # the request's `user`: who, behind the tenant, asked

    @property
    def prompt_tokens(self) -> int:
        return self.generation.prompt_tokens

    @property
    def fingerprint(self) -> str:
        return (
            "laneway-sim"
            if self.deployment.spec.engine_kind == "sim"
            else f"laneway-{self.deployment.spec.engine_kind}"
        )


class Gateway:
    def __init__(self, registry: EngineRegistry, recorder: UsageRecorder, *, default_max_tokens: int = 512) -> None:
        self.registry = registry
        self.recorder = recorder
        self.default_max_tokens = default_max_tokens

    def visible_models(self, tenant: TenantSnapshot) -> list[str]:
        return [a for a in self.registry.aliases() if tenant.may_use(a)]

    def prepare(
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
    ) -> Call:
        try:
            deployment = self.registry.resolve(alias)
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
        engine = deployment.engine
        measured = engine.measure(prompt=prompt, messages=messages)
        context = engine.info.max_model_len
        room = context - measured.tokens
        if room <= 0:
            raise GatewayError(
                413,
                f"This model's maximum context length is {context} tokens; your prompt has "
                f"{measured.tokens} tokens and leaves no room for a completion.",
                code="context_length_exceeded",
                param="messages" if messages else "prompt",
            )
        # The client's own max_tokens is honoured when lower; never above the context left.
        budget = min(max_tokens or self.default_max_tokens, room)
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
            stop=tuple(stop),
        )
        return Call(
            request_id=request_id,
            tenant=tenant,
            alias=alias,
            endpoint=endpoint,
            stream=stream,
            deployment=deployment,
            generation=generation,
            end_user=user[:200] if user else None,
        )

    async def run(self, call: Call) -> AsyncIterator[Delta]:
        """Yield deltas with non-empty text (or a final one with finish_reason)."""
        deployment = call.deployment
        deployment.outstanding += 1
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
                    yield Delta(text=text, tokens=0, finish_reason=call.finish_reason)
                    return
                if text:
                    yield Delta(text=text, tokens=delta.tokens)
            # An engine that ends without a finish_reason ran out of tokens to give.
            call.finish_reason = "length"
            yield Delta(text=matcher.flush(), tokens=0, finish_reason="length")
        except EngineError as exc:
            log.error("engine error on %s (%s): %s", call.request_id, deployment.spec.name, exc)
            call.status, call.error_code = 503, "engine_error"
            raise GatewayError(
                503, f"The engine serving '{call.alias}' failed: {exc}", code="engine_error", retry_after=1
            ) from exc
        except (asyncio.CancelledError, GeneratorExit):
            call.status, call.error_code = CLIENT_CLOSED, "client_disconnected"
            raise
        finally:
            await engine_stream.aclose()  # closing the engine stream is the cancellation
            deployment.outstanding -= 1
            self._account(call)

    def _account(self, call: Call) -> None:
        now = time.perf_counter()
        self.recorder.record(
            {
                "request_id": call.request_id,
                "tenant_id": call.tenant.id,
                "api_key_id": call.tenant.api_key_id,
                "model": call.alias,
                "deployment": call.deployment.spec.name,
                "lane": None,
                "endpoint": call.endpoint,
                "stream": call.stream,
                "end_user": call.end_user,
                "status": call.status,
                "finish_reason": call.finish_reason,
                "error_code": call.error_code,
                "prompt_tokens": call.prompt_tokens,
                "completion_tokens": call.completion_tokens,
                "queue_ms": 0.0,
                "ttft_ms": None if call.first_token_at is None else (call.first_token_at - call.started) * 1000,
                "total_ms": (now - call.started) * 1000,
            }
        )
