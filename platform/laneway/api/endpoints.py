"""One record per /v1 endpoint that runs a request through the pipeline: its path, its handler
function and what each place that serves or describes it needs to know.

The record is the only thing an endpoint declares; api/registry.py holds the records, and every
place reads them there: the app's routes (`route()`, here: a Litestar handler whose OpenAPI
operation is described by the record's wire types), the plain-ASGI hot path (api/fast.py,
`fast`), the batch runner and the batch's input check (api/batches/, `batch`) and the root
span of a traced request (`span`). So adding an endpoint is one record and one registration.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response, post
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream

from laneway.api import openapi
from laneway.api.request import Incoming
from laneway.api.services import Api, ApiServices

# A handler function: a request (Litestar's, api/fast.py's or a batch line's) and the runtime's
# services in, the answer out (a whole JSON body, or a stream when the body asked for one).
Handler = Callable[[Incoming, ApiServices], Awaitable[Response[bytes] | Stream]]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A POST route under /v1 served by `handler`."""

    path: str  # "/v1/chat/completions"
    handler: Handler
    name: str  # the handler's name in the OpenAPI document (its summary and operation id)
    request: type[Any]  # the msgspec Struct the handler decodes the body into
    response: type[Any]  # the Struct of the 200 JSON answer
    span: str  # the root span's name when tracing is on ("chat.completions")
    stream_chunk: type[Any] | None = None  # with `stream: true`: `data:` events of this Struct
    stream_events: Sequence[type[Any]] = ()  # or: named events of these Structs
    fast: bool = False  # served below Litestar by api/fast.py (the hot path) when tracing is off
    batch: bool = True  # a batch may name it as its endpoint (a line's `url`)
    error_shape: openapi.ErrorShape = openapi.OPENAI_ERRORS  # what its errors look like (documented)

    def operation(self) -> type[Any]:
        """The OpenAPI operation of the route: the wire types, the errors, the routing headers."""
        stream: dict[str, Any] = {}
        if self.stream_chunk is not None:
            stream["stream_chunk"] = self.stream_chunk
        if self.stream_events:
            stream["stream_events"] = tuple(self.stream_events)
        return openapi.generation(self.response, self.request, error_shape=self.error_shape, **stream)

    def route(self) -> HTTPRouteHandler:
        """The Litestar route: the handler behind the one `api` dependency (api/services.py)."""
        run = self.handler

        async def handle(request: Request, api: Api) -> Response[bytes] | Stream:  # type: ignore[type-arg]
            return await run(request, api)

        handle.__name__ = handle.__qualname__ = self.name  # what Litestar names the operation after
        return post(
            self.path, status_code=200, operation_class=self.operation(), security=openapi.API_KEY, name=self.name
        )(handle)
