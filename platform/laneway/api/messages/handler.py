"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat
pipeline.

A request becomes chat turns (api/messages/translate.py) and runs exactly as a chat completion
does: the same key (sent as `x-api-key` or `Authorization: Bearer`), rate limits, quotas,
budgets, lanes, admission, max-token policy, stops, routing, failover, lease and usage row
(endpoint "messages"). What differs is the wire: the answer is an Anthropic Message, a stream
its named events (api/messages/stream.py), an error Anthropic's shape (api/messages/errors.py,
chosen by path in api/errors.py). count_tokens runs the pipeline's own prepare (what the
route tester runs): the prompt as the engine would be sent it, measured, nothing generated,
no limit touched.
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator

from litestar import MediaType, Response
from litestar.response import Stream

from laneway.api.disconnect import ClientDisconnected, HttpClient
from laneway.api.endpoints import Endpoint
from laneway.api.messages import protocol as mp
from laneway.api.messages.errors import ERROR_SHAPE, PATH
from laneway.api.messages.stream import MessageAssembler
from laneway.api.messages.translate import PARAM, check_version, count_intent, message_intent
from laneway.api.protocol import encode
from laneway.api.request import Incoming, authenticate, decode
from laneway.api.services import ApiServices
from laneway.api.stream import respond, sse
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import CLIENT_CLOSED, Completed, Streaming


def _named(exc: GatewayError) -> GatewayError:
    """The pipeline names chat's parameters (`stop`, `user`): name this API's."""
    exc.param = PARAM.get(exc.param or "", exc.param)
    return exc


async def create_message(request: Incoming, api: ApiServices) -> Response[bytes] | Stream:
    """POST /v1/messages."""
    tenant = await authenticate(request, api.authenticator, key_header="x-api-key")
    check_version(request)
    req = await decode(request, mp.MessagesRequest)  # an unknown parameter is a 400 naming it
    intent = message_intent(request, req)
    try:
        answer = await api.gateway.serve(tenant, intent, HttpClient(request))
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    except GatewayError as exc:
        raise _named(exc) from None
    assembler = MessageAssembler(answer.call, stream=req.stream, stop_sequences=req.stop_sequences or ())

    def body(done: Completed) -> mp.AnthropicMessage:
        for delta in done.deltas:
            assembler.feed(delta)
        return assembler.message(final=True)

    def events(stream: Streaming) -> AsyncIterator[bytes]:
        # Named events and no [DONE]: message_stop ends it; a failure, an `error` event.
        return sse(stream, assembler.start(), assembler.feed, None, fail=assembler.failed, done=b"")

    return respond(api, answer, body, events)


async def count_tokens(request: Incoming, api: ApiServices) -> Response[bytes]:
    """POST /v1/messages/count_tokens: the prompt's tokens as the model would be sent it."""
    tenant = await authenticate(request, api.authenticator, key_header="x-api-key")
    check_version(request)
    req = await decode(request, mp.CountTokensRequest)
    try:
        planned = await api.gateway.dry_run(tenant, count_intent(request, req))
    except GatewayError as exc:
        raise _named(exc) from None
    return Response(encode(mp.TokenCount(input_tokens=planned.call.prompt_tokens)), media_type=MediaType.JSON)


MESSAGES = Endpoint(
    PATH,
    create_message,
    name="create_message",
    request=mp.MessagesRequest,
    response=mp.AnthropicMessage,
    stream_events=typing.get_args(mp.StreamEvent),
    span="messages",
    error_shape=ERROR_SHAPE,
    fast=True,  # served below Litestar as chat is (api/fast.py): its errors still by path
)


async def _count_tokens(request: Incoming, api: ApiServices) -> Response[bytes] | Stream:
    return await count_tokens(request, api)


COUNT_TOKENS = Endpoint(
    PATH + "/count_tokens",
    _count_tokens,
    name="count_message_tokens",
    request=mp.CountTokensRequest,
    response=mp.TokenCount,
    span="messages.count_tokens",
    batch=False,  # nothing is generated: nothing a batch would run
    error_shape=ERROR_SHAPE,
)
