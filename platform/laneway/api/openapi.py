"""The OpenAPI document at /schema/openapi.json (also /schema): laneway's wire described by
the msgspec Structs the routes actually decode and encode (api/protocol.py).

The routes take the raw request and decode it with msgspec (fast, strict), so Litestar sees
no body type to describe, and its own generator misplaces some msgspec constraints (a
minimum of 0, a list's maxItems). msgspec's JSON Schema is what msgspec accepts, so that is
what the document shows: each route names its wire types with `operation(...)` (the
endpoints' routes with `generation(...)`, from their records: api/endpoints.py), an
operation_class that fills in the request body, the responses (OpenAI's error shape for
every error status the route can answer) and the headers; `add_wire_schemas(app)` adds the
schemas of the Structs the app's routes name as components (Litestar replaces a config's components.schemas with the
ones it generated, so they go into the built document instead).

Only the JSON is served: Litestar's HTML pages (Swagger, ReDoc, Scalar...) load their
scripts from a CDN, which an offline or locked-down gateway cannot reach, and vendoring
megabytes of JavaScript for pages a gateway does not need is not worth it. Any OpenAPI
viewer can open the JSON. /schema is behind the metrics token when one is set (health.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec
from litestar import Litestar, Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    Components,
    Discriminator,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    Reference,
    RequestBody,
    Schema,
    SecurityRequirement,
    SecurityScheme,
)

from laneway import __version__
from laneway.api import protocol as p

# Security requirements, by the names of the schemes in openapi_config() (the admin API's are
# the composition's to add: admin/openapi.py).
API_KEY: list[SecurityRequirement] = [{"apiKey": []}]
METRICS_TOKEN: list[SecurityRequirement] = [{"metricsToken": []}, {}]  # {}: open when no token is set

# The Structs every document has beyond the routes' own (the error shape, which each route's
# errors name); the routes' are found on them (add_wire_schemas).
WIRE_TYPES: tuple[type[Any], ...] = (p.ErrorEnvelope,)


_ERRORS = {
    400: "The request is invalid, or asks for what laneway cannot do (`param` names it).",
    401: "No API key, or not a valid one.",
    403: "The key's tenant is disabled, or may not use this model or lane.",
    404: "No such model (or not visible to this key).",
    413: "The request body is too large.",
    429: "A rate limit or quota is used up; Retry-After says when to retry.",
    500: "The gateway failed (a bug; it is logged).",
    503: "Overloaded, shutting down, an engine or dependency is down, or the queue timed out; see Retry-After.",
}
V1_ERRORS = (401, 403, 500, 503)  # every /v1 route: the key check, and the key store being down
COMPLETION_ERRORS = (400, 401, 403, 404, 413, 429, 500, 503)

_TEXT = Schema(type=OpenAPIType.STRING)
_REQUEST_ID = OpenAPIHeader(
    schema=_TEXT,
    description="The client's own X-Request-Id when it sent a sane one (1-64 of [A-Za-z0-9_.:-]), else the "
    "completion's id, else a fresh req_... id.",
)
_RETRY_AFTER = OpenAPIHeader(schema=Schema(type=OpenAPIType.INTEGER), description="Seconds to wait before a retry.")
_LANE = OpenAPIHeader(schema=_TEXT, description="The lane the request was routed to.")
REQUEST_ID_PARAM = Parameter(
    name="X-Request-Id",
    param_in="header",
    schema=_TEXT,
    description="Your id for this request, kept end to end (response header, usage row, engine) when it is "
    "1-64 of [A-Za-z0-9_.:-]; anything else is ignored and a fresh id is used.",
)
ROUTING_PARAMS = (
    Parameter(name="X-Laneway-Task", param_in="header", schema=_TEXT, description="The task (for its policy)."),
    Parameter(name="X-Laneway-Lane", param_in="header", schema=_TEXT, description="A lane, if the tenant may choose."),
    Parameter(
        name="X-Laneway-Priority",
        param_in="header",
        schema=Schema(type=OpenAPIType.INTEGER),
        description="Priority within the tenant's allowance (never above its floor).",
    ),
    Parameter(
        name="X-Laneway-TTFT-Target-Ms",
        param_in="header",
        schema=Schema(type=OpenAPIType.NUMBER, exclusive_minimum=0, maximum=86_400_000),
        description="A tighter time-to-first-token target than the lane's, in ms, within the tenant's grant "
        "(never tighter than its min_ttft_target_ms; without that grant it changes nothing).",
    ),
    Parameter(
        name="X-Laneway-Want-Predicted-TTFT",
        param_in="header",
        schema=_TEXT,
        description="1: answer with X-Laneway-Predicted-TTFT-Ms, the ms from arrival to the first token laneway "
        "predicted when the request took its slot (absent while the replica's latency model is still learning).",
    ),
)


def _ref(kind: type[Any]) -> Reference:
    return Reference(ref=f"#/components/schemas/{kind.__name__}")


def named_sse_event(events: Sequence[type[Any]]) -> Schema:
    """One server-sent event of a stream of named events (the Responses API's): `event` names
    it and `data` is that event's JSON; no [DONE] ends it."""
    json_data = Schema(
        type=OpenAPIType.STRING,
        content_media_type="application/json",
        content_schema=Schema(one_of=[_ref(e) for e in events]),
    )
    return Schema(
        type=OpenAPIType.OBJECT,
        required=["event", "data"],
        properties={"event": Schema(type=OpenAPIType.STRING), "data": json_data},
    )


def sse_event(chunk: type[Any]) -> Schema:
    """One server-sent event of a stream (OpenAPI 3.1 reads a text/event-stream schema per
    event): data is a chunk's JSON, an error's (a failure mid-stream), or the last [DONE]."""
    json_data = Schema(
        type=OpenAPIType.STRING,
        content_media_type="application/json",
        content_schema=Schema(one_of=[_ref(chunk), _ref(p.ErrorEnvelope)]),
    )
    return Schema(
        type=OpenAPIType.OBJECT,
        required=["data"],
        properties={"data": Schema(one_of=[Schema(type=OpenAPIType.STRING, const="[DONE]"), json_data])},
    )


@dataclass(frozen=True)
class ErrorShape:
    """The JSON every error status of a route answers with: OpenAI's, or another API's for
    the endpoints that speak it (api/messages/: Anthropic's, where laneway's 503 is a 529)."""

    body: type[Any]
    name: str  # as the document says it: "OpenAI's error shape"
    statuses: Mapping[int, int] = field(default_factory=dict)  # laneway's status -> the one sent


OPENAI_ERRORS = ErrorShape(p.ErrorEnvelope, "OpenAI's error shape")


@dataclass(frozen=True)
class Wire:
    """What one route reads and writes."""

    response: type[Any] | None  # the 200 JSON body; None: keep what Litestar derived
    request: type[Any] | None = None
    stream_chunk: type[Any] | None = None  # with `stream: true`: server-sent events of these
    stream_events: Sequence[type[Any]] = ()  # or: named events of these types
    errors: Sequence[int] = V1_ERRORS
    parameters: Sequence[Parameter] = (REQUEST_ID_PARAM,)
    headers: dict[str, OpenAPIHeader] | None = None  # on the 200 beyond X-Request-Id
    why: dict[int, str] | None = None  # an error status's meaning, where it is not the usual one
    error_shape: ErrorShape = OPENAI_ERRORS


@dataclass
class _WireOperation(Operation):
    wire: ClassVar[Wire]

    def __post_init__(self) -> None:
        wire = self.wire
        if wire.request is not None:
            self.request_body = RequestBody(
                content={"application/json": OpenAPIMediaType(schema=_ref(wire.request))}, required=True
            )
        self.parameters = [*(self.parameters or ()), *wire.parameters]
        # Litestar's own error responses (its 400 for parameters) are not what laneway answers.
        ok: Any = (self.responses or {}).get("200")
        responses: dict[str, OpenAPIResponse | Reference] = {}
        if wire.response is not None:
            content = {"application/json": OpenAPIMediaType(schema=_ref(wire.response))}
            description = "OK"
            if wire.stream_chunk is not None:
                name = wire.stream_chunk.__name__
                content["text/event-stream"] = OpenAPIMediaType(schema=sse_event(wire.stream_chunk))
                description = (
                    f"The {wire.response.__name__}; with `stream: true`, server-sent events instead: one "
                    f"`data: <{name} JSON>` per chunk, then `data: [DONE]` (a failure mid-stream is a last "
                    '`data: {"error": ...}` event).'
                )
            if wire.stream_events:
                content["text/event-stream"] = OpenAPIMediaType(schema=named_sse_event(wire.stream_events))
                description = (
                    f"The {wire.response.__name__}; with `stream: true`, named server-sent events instead "
                    "(`event: <type>` and `data: <its JSON>`), in the order of the API it speaks."
                )
            ok = OpenAPIResponse(description=description, content=content)
        if isinstance(ok, OpenAPIResponse):
            ok.headers = {**(ok.headers or {}), "X-Request-Id": _REQUEST_ID, **(wire.headers or {})}
            responses["200"] = ok
        shape = wire.error_shape
        for status in wire.errors:
            headers: dict[str, OpenAPIHeader | Reference] = {"X-Request-Id": _REQUEST_ID}
            if status in (429, 503):
                headers["Retry-After"] = _RETRY_AFTER
            responses[str(shape.statuses.get(status, status))] = OpenAPIResponse(
                description=(wire.why or {}).get(status, _ERRORS[status]) + f" {shape.name}.",
                content={"application/json": OpenAPIMediaType(schema=_ref(shape.body))},
                headers=headers,
            )
        self.responses = responses


def operation(wire: Wire) -> type[Operation]:
    """An operation_class for a route decorator that describes `wire`."""
    return type("WireOperation", (_WireOperation,), {"wire": wire})


def generation(
    response: type[Any], request: type[Any], *, error_shape: ErrorShape = OPENAI_ERRORS, **stream: Any
) -> type[Operation]:
    """The operation of an endpoint that runs a request through the pipeline (api/endpoints.py)."""
    return operation(
        Wire(
            response,
            request=request,
            errors=COMPLETION_ERRORS,
            error_shape=error_shape,
            parameters=(REQUEST_ID_PARAM, *ROUTING_PARAMS),
            headers={"X-Laneway-Lane": _LANE},
            **stream,
        )
    )


MODEL_LIST = operation(Wire(p.ModelList))
MODEL = operation(Wire(p.ModelCard, errors=(401, 403, 404, 500, 503)))
METRICS = operation(Wire(None, errors=(401,), parameters=(), why={401: "A metrics token is set, and not sent."}))


def json_schema_to_spec(node: dict[str, Any]) -> Schema | Reference:
    """A JSON Schema (as msgspec writes it) as Litestar's Schema objects; an unknown keyword
    fails here, at start-up, not in a client's parser."""
    if "$ref" in node:
        return Reference(ref=node["$ref"])
    aliases = Schema.field_aliases()
    fields: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            value = [json_schema_to_spec(v) for v in value]
        elif key in ("properties", "patternProperties", "dependentSchemas"):
            value = {k: json_schema_to_spec(v) for k, v in value.items()}
        elif key == "type":
            value = OpenAPIType(value) if isinstance(value, str) else [OpenAPIType(v) for v in value]
        elif key == "discriminator":  # a tagged union's: its mapping names schemas, it is not one
            value = Discriminator(property_name=value["propertyName"], mapping=value.get("mapping"))
        elif isinstance(value, dict) and key not in ("default", "const"):
            value = json_schema_to_spec(value)
        fields[aliases.get(key, key)] = value
    return Schema(**fields)


def wire_schemas(types: Sequence[type[Any]]) -> dict[str, Schema | Reference]:
    _, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    return {name: json_schema_to_spec(schema) for name, schema in components.items()}


def route_wire_types(app: Litestar) -> list[type[Any]]:
    """The Structs the app's routes read and write, as their operations (`operation(...)`)
    name them, after WIRE_TYPES; each once, in the routes' order."""
    found: dict[type[Any], None] = dict.fromkeys(WIRE_TYPES)
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            kind = getattr(handler, "operation_class", None)
            if isinstance(kind, type) and issubclass(kind, _WireOperation):
                wire = kind.wire
                named = (wire.request, wire.response, wire.stream_chunk, *wire.stream_events, wire.error_shape.body)
                found.update(dict.fromkeys(t for t in named if t is not None))
    return list(found)


def add_wire_schemas(app: Litestar) -> None:
    """Put the Structs' schemas into the app's document (built once, here: ~10 ms)."""
    schemas: dict[str, Any] = app.openapi_schema.components.schemas
    schemas.update(wire_schemas(route_wire_types(app)))


def openapi_config(
    *, guards: Sequence[Callable[..., Any]], security_schemes: Mapping[str, SecurityScheme] | None = None
) -> OpenAPIConfig:
    """The document's title, version and security schemes (`security_schemes`: those of other
    routes than /v1's, the admin API's); only the JSON under /schema, behind `guards` (the
    metrics token's)."""
    return OpenAPIConfig(
        title="laneway",
        version=__version__,
        description="An OpenAI-compatible gateway: /v1 speaks OpenAI's API; /admin/api is the admin API.",
        components=Components(
            security_schemes={
                "apiKey": SecurityScheme(type="http", scheme="bearer", description="A laneway API key (sk-...)."),
                **(security_schemes or {}),
                "metricsToken": SecurityScheme(
                    type="http", scheme="bearer", description="LANEWAY_METRICS_TOKEN, when one is set."
                ),
            }
        ),
        render_plugins=[JsonRenderPlugin()],  # served at /schema/openapi.json and /schema
        openapi_router=Router(path="/schema", route_handlers=[], guards=list(guards), include_in_schema=False),
    )
