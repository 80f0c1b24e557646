"""The OpenAI generation endpoints (chat, completions) and the models routes: each generation
handler authenticates, translates the body into one intent (api/request.py), calls the
pipeline's one entry (Gateway.serve) and translates its answer back (api/stream.py). The
pipeline owns the order of the stages and the lease. CHAT and COMPLETIONS are their records
(api/endpoints.py): the routes, the fast path and the batch lines are built from them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from litestar import Controller, MediaType, Request, Response, get
from litestar.params import FromPath
from litestar.response import Stream

from laneway.api import openapi
from laneway.api import protocol as p
from laneway.api.choices import Collected, chat_choices, completion_choices
from laneway.api.disconnect import ClientDisconnected, HttpClient
from laneway.api.endpoints import Endpoint
from laneway.api.request import Incoming, authenticate, chat_intent, completion_intent, decode
from laneway.api.services import Api, ApiServices
from laneway.api.stream import chat_events, completion_events, respond, usage
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import CLIENT_CLOSED, Completed, Gateway, Streaming


def _card(gateway: Gateway, alias: str, created: int) -> p.ModelCard:
    return p.ModelCard(id=alias, created=created, capabilities=sorted(gateway.capabilities(alias)))


class ModelsController(Controller):
    """Each handler takes one dependency, `api` (the runtime's ApiServices): one provider call,
    not one per service."""

    path = "/v1"
    security = openapi.API_KEY  # the bodies are decoded here, by msgspec: api/openapi.py describes them

    @get("/models", media_type=MediaType.JSON, operation_class=openapi.MODEL_LIST)
    async def list_models(self, request: Request, api: Api) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, api.authenticator)
        gateway = api.gateway
        created = int(api.started_at)
        cards = [_card(gateway, a, created) for a in gateway.visible_models(tenant)]
        return Response(p.encode(p.ModelList(data=cards)), media_type=MediaType.JSON)

    @get("/models/{model_id:path}", media_type=MediaType.JSON, operation_class=openapi.MODEL)
    async def get_model(self, request: Request, api: Api, model_id: FromPath[str]) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, api.authenticator)
        gateway = api.gateway
        alias = model_id.lstrip("/")
        if alias not in gateway.visible_models(tenant):
            raise GatewayError(
                ErrorCode.MODEL_NOT_FOUND,
                f"The model '{alias}' does not exist or you do not have access to it.",
                param="model",
            )
        card = _card(gateway, alias, int(api.started_at))
        return Response(p.encode(card), media_type=MediaType.JSON)


async def chat_completions(request: Incoming, api: ApiServices) -> Response[bytes] | Stream:
    """POST /v1/chat/completions."""
    tenant = await authenticate(request, api.authenticator)
    req = await decode(request, p.ChatCompletionRequest)
    intent = chat_intent(request, req)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    want_logprobs = intent.logprobs is not None

    def body(done: Completed) -> p.ChatCompletion:
        call = done.call
        return p.ChatCompletion(
            id=call.request_id,
            created=int(time.time()),
            model=call.public_model,
            choices=chat_choices(Collected.of(call.generation.n, done.deltas), want_logprobs),
            usage=usage(call),
            system_fingerprint=call.fingerprint,
        )

    def events(stream: Streaming) -> AsyncIterator[bytes]:
        return chat_events(stream, include_usage, want_logprobs)

    try:
        answer = await api.gateway.serve(tenant, intent, HttpClient(request))
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    return respond(api, answer, body, events, request.headers)


async def completions(request: Incoming, api: ApiServices) -> Response[bytes] | Stream:
    """POST /v1/completions."""
    tenant = await authenticate(request, api.authenticator)
    req = await decode(request, p.CompletionRequest)
    intent = completion_intent(request, req)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    echo = (intent.prompt or "") if req.echo else ""
    want_logprobs = req.logprobs is not None

    def body(done: Completed) -> p.Completion:
        call = done.call
        return p.Completion(
            id=call.request_id,
            created=int(time.time()),
            model=call.public_model,
            choices=completion_choices(Collected.of(call.generation.n, done.deltas), echo, want_logprobs),
            usage=usage(call),
            system_fingerprint=call.fingerprint,
        )

    def events(stream: Streaming) -> AsyncIterator[bytes]:
        return completion_events(stream, include_usage, echo, want_logprobs)

    try:
        answer = await api.gateway.serve(tenant, intent, HttpClient(request))
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    return respond(api, answer, body, events, request.headers)


CHAT = Endpoint(
    "/v1/chat/completions",
    chat_completions,
    name="chat_completions",
    request=p.ChatCompletionRequest,
    response=p.ChatCompletion,
    stream_chunk=p.ChatCompletionChunk,
    span="chat.completions",
    fast=True,
)
COMPLETIONS = Endpoint(
    "/v1/completions",
    completions,
    name="completions",
    request=p.CompletionRequest,
    response=p.Completion,
    stream_chunk=p.Completion,
    span="completions",
    fast=True,
)
