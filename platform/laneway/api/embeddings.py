"""POST /v1/embeddings, OpenAI-compatible: decode and check the body, hand it to the pipeline
(Gateway.serve with an EmbeddingIntent: a completion without generation), encode the vectors
as floats or as base64 of little-endian float32 (what the official SDKs ask for by default,
and decode)."""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Any, Literal

import numpy as np
from litestar import MediaType, Response
from msgspec import Meta, Struct
from numpy.typing import NDArray

from laneway.api.disconnect import ClientDisconnected, HttpClient
from laneway.api.endpoints import Endpoint
from laneway.api.protocol import encode
from laneway.api.request import Incoming, authenticate, decode, routing, unsupported
from laneway.api.services import ApiServices
from laneway.api.stream import lane_header
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import invalid_request
from laneway.core.pipeline import CLIENT_CLOSED, Call, EmbeddingIntent
from laneway.types import Embeddings

# Inputs one request may carry: OpenAI's limit (its SDKs and LangChain batch within it).
MAX_INPUTS = 2048
# Floats in an answer beyond which encoding it runs in a thread (about 10 ms of encoding).
OFF_LOOP_FLOATS = 1 << 18


class CreateEmbeddingRequest(Struct, kw_only=True, frozen=True):
    model: Annotated[str, Meta(min_length=1)]
    # A string or a list (of strings; token-id arrays are refused, see _inputs); one array type
    # only, as msgspec unions allow, the items checked here.
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class EmbeddingData(Struct, kw_only=True):
    object: str = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(Struct, kw_only=True):
    object: str = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def _inputs(req: CreateEmbeddingRequest) -> list[str]:
    """The texts to embed, or a 400 in OpenAI's shape naming `input`."""
    items = [req.input] if isinstance(req.input, str) else req.input
    if not items:
        raise invalid_request("`input` must not be empty: give a string or a list of strings.", param="input")
    if len(items) > MAX_INPUTS:
        raise invalid_request(
            f"`input` has {len(items)} items; one request may embed at most {MAX_INPUTS}.", param="input"
        )
    if all(isinstance(x, int) and not isinstance(x, bool) for x in items) or all(isinstance(x, list) for x in items):
        # Token ids only mean something for the tokenizer that made them; the client's (often
        # tiktoken, as LangChain sends) need not be the model's, and a wrong one embeds noise.
        raise unsupported("input", "token-id arrays; send the text instead")
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise invalid_request(
                f"`input[{i}]` must be a string, got {type(x).__name__}.", param="input", code=ErrorCode.INVALID_TYPE
            )
        if not x:
            raise invalid_request(f"`input[{i}]` is an empty string; every input needs text.", param="input")
    return items  # each item checked to be a str above


def _encoded(vector: NDArray[np.float32], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
    return vector.tolist()  # type: ignore[no-any-return]  # float32 values as floats: base64 decodes to the same


def _body(call: Call, result: Embeddings, encoding_format: str) -> bytes:
    data = [EmbeddingData(index=i, embedding=_encoded(v, encoding_format)) for i, v in enumerate(result.vectors)]
    usage = EmbeddingUsage(prompt_tokens=call.prompt_tokens, total_tokens=call.prompt_tokens)
    return encode(CreateEmbeddingResponse(data=data, model=call.public_model, usage=usage))


async def create_embeddings(request: Incoming, api: ApiServices) -> Response[bytes]:
    """POST /v1/embeddings."""
    tenant = await authenticate(request, api.authenticator)
    req = await decode(request, CreateEmbeddingRequest)
    if req.dimensions is not None:
        raise unsupported("dimensions", "shortened vectors; the model's vectors keep their own length")
    intent = EmbeddingIntent(alias=req.model, inputs=_inputs(req), **routing(request, None, req.user))
    try:
        embedded = await api.gateway.serve(tenant, intent, HttpClient(request))
    except ClientDisconnected:
        return Response(b"", status_code=CLIENT_CLOSED)
    call, result = embedded.call, embedded.result
    headers = lane_header(call)
    if result.vectors.size > OFF_LOOP_FLOATS:  # a big answer's encoding would hold up every other request
        body = await asyncio.to_thread(_body, call, result, req.encoding_format)
    else:
        body = _body(call, result, req.encoding_format)
    return Response(body, media_type=MediaType.JSON, headers=headers)


EMBEDDINGS = Endpoint(
    "/v1/embeddings",
    create_embeddings,
    name="create_embeddings",
    request=CreateEmbeddingRequest,
    response=CreateEmbeddingResponse,
    span="embeddings",
)
