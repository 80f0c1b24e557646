"""The endpoints laneway serves (api/endpoints.py's records), by path: the built-in ones, and
any that `register()` adds. Everything that routes, runs or describes an endpoint reads them
here, so an endpoint added is served, batchable, traced and documented by that one call.

Read when an app is built (create_app: its routes and the OpenAPI document; server_config:
the fast path's table, built once) and when a batch is created or a line runs: register an
endpoint before create_app builds the app that is to serve it.
"""

from __future__ import annotations

from laneway.api.embeddings import EMBEDDINGS
from laneway.api.endpoints import Endpoint, Handler
from laneway.api.handlers import CHAT, COMPLETIONS
from laneway.api.messages.handler import COUNT_TOKENS, MESSAGES
from laneway.api.responses.handler import RESPONSES

_ENDPOINTS: dict[str, Endpoint] = {
    e.path: e for e in (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, COUNT_TOKENS)
}


def register(endpoint: Endpoint) -> None:
    """Serve `endpoint` in the apps built from now on; its path must be new."""
    if endpoint.path in _ENDPOINTS:
        raise ValueError(f"an endpoint is already registered at {endpoint.path}")
    _ENDPOINTS[endpoint.path] = endpoint


def unregister(path: str) -> None:
    """Forget the endpoint at `path` (apps already built keep serving it)."""
    del _ENDPOINTS[path]


def endpoints() -> tuple[Endpoint, ...]:
    """Every endpoint, built-in ones first, in the order they were registered."""
    return tuple(_ENDPOINTS.values())


def fast_routes() -> dict[str, Handler]:
    """api/fast.py's table: the handler of each endpoint it serves, by path."""
    return {e.path: e.handler for e in _ENDPOINTS.values() if e.fast}


def batch_endpoint(path: str) -> Endpoint | None:
    """The endpoint a batch may name at `path`, if any."""
    endpoint = _ENDPOINTS.get(path)
    return endpoint if endpoint is not None and endpoint.batch else None


def batch_paths() -> tuple[str, ...]:
    return tuple(e.path for e in _ENDPOINTS.values() if e.batch)
