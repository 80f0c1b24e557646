"""POST /v1/responses: OpenAI's Responses API on the chat pipeline.

A request becomes chat turns (instructions first, as a system turn) and runs exactly as a chat
completion does: the same auth, rate limits, lanes, admission, lease and usage row (endpoint
"responses"), through the chat path's one pipeline entry. What differs is the wire: the
answer is a Response object, and a stream is the Responses API's named events, built from the
pipeline's deltas by ResponseAssembler.

laneway is stateless: nothing is stored, so `previous_response_id`, `conversation` and stored
prompts are refused (400 unsupported_parameter), and every response says `store: false`.
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator

from litestar import Response
from litestar.response import Stream

from laneway.api.disconnect import ClientDisconnected, HttpClient
from laneway.api.endpoints import Endpoint
from laneway.api.request import Incoming, authenticate, decode, hints
from laneway.api.responses import protocol as rp
from laneway.api.responses.assembler import ResponseAssembler, in_progress, response_usage
from laneway.api.responses.request import (
    chat_response_format,
    chat_tool_choice,
    chat_tools,
    feature_arguments,
    input_turns,
    refuse_unsupported,
    text_format,
)
from laneway.api.services import ApiServices
from laneway.api.stream import respond, sse
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import CLIENT_CLOSED, Completed, GenerationIntent, Streaming

# Chat Completions parameter -> the Responses API's name for it.
_RESPONSES_PARAM = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}


async def create_response(request: Incoming, api: ApiServices) -> Response[bytes] | Stream:
    """POST /v1/responses."""
    tenant = await authenticate(request, api.authenticator)
    req = await decode(request, rp.ResponsesRequest)  # an unknown parameter is a 400 naming it
    refuse_unsupported(req)
    turns = input_turns(req.instructions, req.input)
    fmt = text_format(req.text)
    features = feature_arguments(
        chat_tools(req.tools),
        chat_tool_choice(req.tool_choice),
        req.parallel_tool_calls,
        chat_response_format(fmt),
        turns,
    )
    routing = hints(request, req)
    routing["task"] = routing["task"] or "chat"  # a Responses request is a chat: the chat task policy applies
    intent = GenerationIntent(
        endpoint="responses",
        alias=req.model,
        stream=req.stream,
        messages=turns,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        **features,
        **routing,
    )
    try:
        answer = await api.gateway.serve(tenant, intent, HttpClient(request))
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    except GatewayError as exc:  # the pipeline names chat's parameters: name this API's
        exc.param = _RESPONSES_PARAM.get(exc.param or "", exc.param)
        raise
    call = answer.call
    assembler = ResponseAssembler(in_progress(call, req, fmt), lambda: response_usage(call), stream=req.stream)

    def body(done: Completed) -> rp.ResponseObject:
        for delta in done.deltas:
            assembler.feed(delta)
        return assembler.response()

    def events(stream: Streaming) -> AsyncIterator[bytes]:
        # Named events, no [DONE] (OpenAI sends none on this API); a failure ends with response.failed.
        return sse(stream, assembler.start(), assembler.feed, None, fail=assembler.failed, done=b"")

    return respond(api, answer, body, events, request.headers)


RESPONSES = Endpoint(
    "/v1/responses",
    create_response,
    name="create_response",
    request=rp.ResponsesRequest,
    response=rp.ResponseObject,
    stream_events=typing.get_args(rp.StreamEvent),
    span="responses",
)
