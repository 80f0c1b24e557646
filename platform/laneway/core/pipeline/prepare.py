"""prepare: resolve -> measure -> policy (max_tokens, stops) -> route (lane). No waiting, no
resource taken: what comes out is a Call, ready to be leased."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import replace

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core import capabilities
from laneway.core.canary.pools import choose_pool, session_of
from laneway.core.early_stops import rule_for
from laneway.core.ids import random_hex
from laneway.core.pipeline.call import Call, engine_request_id
from laneway.core.pipeline.intent import EmbeddingIntent, GenerationIntent
from laneway.core.policy import PolicyStore
from laneway.core.routing import LaneRouter
from laneway.core.slo import request_ttft_target_ms
from laneway.engines.base import EngineError, embedder
from laneway.engines.registry import EngineRegistry, LiveDeployment, NotServed, UnknownModel
from laneway.types import EmbeddingRequest, GenerationRequest, SamplingExtensions, TenantSnapshot

# Tokens one embeddings request may ask for, all inputs together: OpenAI's own limit, so a
# client written for OpenAI already batches within it.
MAX_EMBEDDING_TOKENS = 300_000
# A request's id is the id of the object it answers with (the Responses API's are resp_...,
# Anthropic's Messages API's msg_...).
_ID_PREFIX = {"responses": "resp_", "messages": "msg_"}


class Preparer:
    def __init__(self, registry: EngineRegistry, policies: PolicyStore, *, default_max_tokens: int) -> None:
        self.registry = registry
        self.policies = policies
        self.router = LaneRouter()
        self.default_max_tokens = default_max_tokens

    async def serving(self, tenant: TenantSnapshot, intent: GenerationIntent, can_take: Callable[[Call], bool]) -> Call:
        """generation(), or, when the alias cannot take the call (no healthy replica, or its
        queue would refuse it), the first of its fallback aliases that can: one the tenant may
        use, served now, with the capabilities the request needs. The answer still names the
        alias asked for (Call.public_model)."""
        call = await self.generation(tenant, intent)
        fallbacks = self.policies.current.fallbacks(intent.alias)
        if not fallbacks or can_take(call):
            return call
        served = set(self.registry.aliases())
        for alias in fallbacks:
            if alias not in served or not tenant.may_use(alias):
                continue
            try:
                other = await self.generation(tenant, replace(intent, alias=alias))
            except GatewayError:  # it lacks a capability the request asks for, or the context
                continue
            if can_take(other):
                other.asked_alias = intent.alias
                return other
        return call

    async def generation(self, tenant: TenantSnapshot, intent: GenerationIntent) -> Call:
        any_replica = self.accessible(
            tenant, intent.alias, _asked_lane(intent)
        )  # replicas of an alias share a tokenizer
        priority = max(intent.priority, tenant.priority_floor)  # no more urgent than the tenant may ask
        offered = tuple(intent.tools) if intent.tool_choice != "none" else ()
        asked_format = intent.response_format
        form = asked_format if (asked_format or {}).get("type", "text") != "text" else None
        messages = intent.messages
        measured = await any_replica.engine.measure(
            prompt=intent.prompt, messages=messages, tools=offered, response_format=form
        )
        snapshot = self.policies.current
        chosen = self.router.route(
            snapshot,
            prompt_tokens=measured.tokens,
            stream=intent.stream,
            task=intent.task,
            explicit_lane=_asked_lane(intent),
            background=intent.background,
        )
        # What the request asks beyond text: the deployment chosen must be able to do it.
        generation = GenerationRequest(
            request_id="",
            prompt=measured.text,
            prompt_tokens=measured.tokens,
            prompt_ids=measured.ids,
            max_tokens=0,
            n=intent.n,
            tools=tuple(intent.tools),
            tool_choice=intent.tool_choice,
            parallel_tool_calls=intent.parallel_tool_calls,
            response_format=form,
            logprobs=intent.logprobs,
            logit_bias=intent.logit_bias or None,
            presence_penalty=intent.presence_penalty,
            frequency_penalty=intent.frequency_penalty,
            extensions=intent.extensions,
        )
        needs = frozenset(c for c, _ in capabilities.asked(generation))
        pool = choose_pool(self.registry.replicas(intent.alias), tenant.id, session_of(intent))
        deployment = self.registry.resolve(intent.alias, chosen.name, needs, role=pool)
        context = deployment.engine.info.max_model_len
        room = context - _kept_prompt_tokens(measured.tokens, intent.extensions)
        if room <= 0:
            raise GatewayError(  # 400, as OpenAI answers it (the SDKs raise BadRequestError)
                ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                f"This model's maximum context length is {context} tokens; your prompt has "
                f"{measured.tokens} tokens and leaves no room for a completion.",
                param="messages" if messages else "prompt",
            )
        budget = snapshot.max_tokens(
            task=intent.task,
            prompt_tokens=measured.tokens,
            requested=intent.max_tokens,
            room=room,
            default=self.default_max_tokens,
        )
        stops = snapshot.stops(
            task=intent.task, model_stops=deployment.spec.config.get("stop", ()), requested=intent.stop
        )
        # The body's id, whatever X-Request-Id the client sent: OpenAI's shape, unique per completion.
        prefix = _ID_PREFIX.get(intent.endpoint, "chatcmpl-" if messages is not None else "cmpl-")
        request_id = prefix + random_hex()
        capabilities.check(deployment.engine.info, intent.alias, generation)
        generation.request_id = engine_request_id(request_id, intent.client_request_id)
        generation.max_tokens = budget
        ext = intent.extensions
        if ext is not None and ext.min_tokens is not None and ext.min_tokens > budget:
            # The task's policy caps what is generated, forced tokens too: an engine refuses
            # min_tokens above max_tokens, so it is brought down to the cap.
            generation.extensions = dataclasses.replace(ext, min_tokens=budget)
        generation.messages = tuple(messages) if messages is not None else None
        generation.temperature = 1.0 if intent.temperature is None else intent.temperature
        generation.top_p = 1.0 if intent.top_p is None else intent.top_p
        generation.seed = intent.seed
        generation.stop = stops
        generation.priority = priority
        generation.stream = intent.stream
        generation.cache_salt = cache_salt(tenant)
        return Call(
            request_id=request_id,
            tenant=tenant,
            alias=intent.alias,
            endpoint=intent.endpoint,
            stream=intent.stream,
            deployment=deployment,
            generation=generation,
            lane=chosen,
            task=intent.task,
            end_user=intent.user[:200] if intent.user else None,
            client_request_id=intent.client_request_id,
            needs=needs,
            prompt_cache_key=intent.prompt_cache_key,
            pool=pool,
            early_rule=rule_for(snapshot.tasks.get(intent.task) if intent.task else None, generation),
            price=snapshot.price(intent.alias),  # the price in force now: a change applies to later requests
            ttft_target_ms=request_ttft_target_ms(chosen, tenant, intent.ttft_target_ms),
        )

    def accessible(
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

    async def embeddings(self, tenant: TenantSnapshot, intent: EmbeddingIntent) -> Call:
        """For POST /v1/embeddings: resolve to a deployment that declares "embeddings", measure
        each input, refuse one beyond the context (as OpenAI does, never truncated), route by
        the inputs' total tokens and task "embeddings"."""
        alias, inputs = intent.alias, intent.inputs
        any_replica = self.accessible(tenant, alias, _asked_lane(intent), embeddings=True)
        priority = max(intent.priority, tenant.priority_floor)
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
        task = intent.task or "embeddings"
        chosen = self.router.route(
            self.policies.current,
            prompt_tokens=total,
            stream=False,
            task=task,
            explicit_lane=_asked_lane(intent),
            background=intent.background,
        )
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
        engine_id = engine_request_id(request_id, intent.client_request_id)
        generation = GenerationRequest(
            request_id=engine_id, prompt="", prompt_tokens=total, max_tokens=0, priority=priority, stream=False
        )
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
            end_user=intent.user[:200] if intent.user else None,
            client_request_id=intent.client_request_id,
            embedding=EmbeddingRequest(
                request_id=engine_id, inputs=tuple(inputs), prompt_tokens=total, priority=priority
            ),
            price=self.policies.current.price(alias),
        )


def cache_salt(tenant: TenantSnapshot) -> str:
    """The tenant's prefix-cache partition: engines reuse cached prompt cells only within it,
    so one tenant can never time another's prompts (clients cannot send their own)."""
    return f"laneway-tenant-{tenant.id}"


def _asked_lane(intent: GenerationIntent | EmbeddingIntent) -> str | None:
    """The lane the client named; a batch line's is the background lane, whatever it named."""
    return None if intent.background else intent.lane


def _kept_prompt_tokens(measured: int, ext: SamplingExtensions | None) -> int:
    """The prompt tokens the engine keeps: truncate_prompt_tokens keeps the last N of them, so
    a long prompt that asks for it is not refused for the context it would have overflowed."""
    keep = ext.truncate_prompt_tokens if ext is not None else None
    return min(measured, keep) if keep is not None and keep > 0 else measured
