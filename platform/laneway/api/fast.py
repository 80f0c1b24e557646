"""The hot path's endpoints (POST /v1/chat/completions, /v1/completions, /v1/messages: the records marked
`fast`, api/endpoints.py) as plain ASGI routes, below Litestar.

Litestar's per-request layers (routing, the Request object, resolving the handler's
parameters, building and sending the Response, the before_send hooks) cost about as much
CPU as the request's own work in the gateway (bench/overhead.py, bench/README.md). These routes
are the hot path, so the server (server/run.py) puts `FastRoutes` in front of the app: it runs
the same handler functions (the records' `handler`) with a minimal request, and sends their
answer itself; everything else, and these routes under any other method, goes to Litestar.
The table of these routes is built once, with the FastRoutes (api/registry.py's fast_routes):
a request's dispatch is one dict lookup.

Nothing a client sees changes: the same errors through the same exception handlers
(api/errors.py, counted in the same metrics), the request-body limit and the premature
disconnect as Litestar answers them, X-Request-Id as api/request_ids.py decides it, the
disconnect/499 handling (the handlers' own), and the OpenAPI document (the controller's
routes are still registered; they answer when the app is served without laneway's server,
as in Litestar's test client). With tracing on, every request goes through Litestar: its
middleware opens the request's span.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from litestar import Litestar, Response
from litestar.exceptions import HTTPException, InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.response import Stream

from laneway.api.errors import ErrorHandlers
from laneway.api.registry import fast_routes
from laneway.api.request_ids import request_id
from laneway.api.services import ApiServices
from laneway.contracts.errors import GatewayError

_JSON = b"application/json"


class FastRequest:
    """What the handlers read of a request (api/handlers.py's Incoming), read off the scope."""

    __slots__ = ("_headers", "max_body", "receive", "scope")

    def __init__(self, scope: Any, receive: Callable[[], Awaitable[Any]], max_body: int | None) -> None:
        self.scope = scope
        self.receive = receive
        self.max_body = max_body
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """Lower-cased names; the first of a repeated header, as Litestar's Headers.get."""
        if self._headers is None:
            headers: dict[str, str] = {}
            for name, value in self.scope["headers"]:
                headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            self._headers = headers
        return self._headers

    async def body(self) -> bytes:
        """The whole body, refused as Litestar's Request.body refuses it: 413 past the limit
        (announced or streamed), 500 when the client leaves before sending all of it."""
        limit = self.max_body
        if limit is not None:
            announced = self.headers.get("content-length")
            if announced is not None and announced.isdigit() and int(announced) > limit:
                raise RequestEntityTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise RequestEntityTooLarge
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif message["type"] == "http.disconnect":
                raise InternalServerException("client disconnected prematurely")


class FastRoutes:
    """ASGI: the generation routes served here, anything else by `app` (the Litestar app)."""

    def __init__(self, app: Litestar, services: Callable[[], ApiServices], errors: ErrorHandlers) -> None:
        self.app = app
        self.services = services  # the runtime's, built when it starts
        self.errors = errors
        limit = app.request_max_body_size  # what Litestar's Request.body enforces on these routes
        self.max_body = limit if isinstance(limit, int) else None
        self.routes = fast_routes()  # built once: a request's dispatch is one dict lookup

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handler = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        scope["path_template"] = scope["path"]  # the metrics' route label, as Litestar sets it
        request = FastRequest(scope, receive, self.max_body)
        try:
            response = await handler(request, self.services())
        except Exception as exc:
            response = self._error(request, exc)
        if isinstance(response, Stream):
            asgi = response.to_asgi_response(
                cast(Any, None), cast(Any, None), headers={"x-request-id": request_id(scope)}
            )
            await asgi(scope, receive, send)
            return
        await _send(send, scope, response)

    def _error(self, request: FastRequest, exc: Exception) -> Response[bytes]:
        """The answer Litestar's exception handling gives (the app's handlers, api/errors.py)."""
        req: Any = request
        if isinstance(exc, GatewayError):
            return self.errors.gateway_error(req, exc)
        if isinstance(exc, HTTPException):
            return self.errors.http_exception(req, exc)
        return self.errors.internal_error(req, exc)


async def _send(send: Any, scope: Any, response: Response[bytes]) -> None:
    body = response.content
    headers = [(b"content-type", _JSON), (b"content-length", str(len(body)).encode())]
    for name, value in response.headers.items():
        headers.append((name.lower().encode("latin-1"), str(value).encode("latin-1")))
    headers.append((b"x-request-id", request_id(scope).encode()))
    await send({"type": "http.response.start", "status": response.status_code or 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
