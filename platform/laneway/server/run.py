"""The server's configuration for a laneway app, and `serve()`, which runs it."""

from __future__ import annotations

import resource
from typing import Any

import uvicorn

from laneway.api.errors import ErrorHandlers
from laneway.api.fast import FastRoutes
from laneway.runtime import runtime_of
from laneway.server.gateway_server import GatewayServer
from laneway.server.start_delay import StartDelay
from laneway.server.uvicorn_fence import protocol_for
from laneway.settings import Settings


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for `app` with the gateway's guards and limits. A laneway app
    is served with its generation routes below Litestar (api/fast.py: the same handlers,
    errors and headers, without Litestar's per-request layers) unless tracing is on, and
    behind StartDelay (the load shedder's view of the loop)."""
    runtime = runtime_of(app)  # None: another ASGI app (a test's stand-in engine), no load shedding
    shedder = runtime.shedder if runtime is not None else None
    asgi = app
    if runtime is not None and runtime.tracing is None:  # traced requests need Litestar's middleware
        asgi = FastRoutes(app, runtime.provide_api, ErrorHandlers(runtime.metrics))
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": protocol_for(settings, shedder),
        "limit_concurrency": settings.http_max_connections,  # connections past it: 503
        "backlog": settings.http_backlog,
        "timeout_keep_alive": settings.http_keep_alive_s,
        # The drain (GatewayServer) has already finished or cut every request by then.
        "timeout_graceful_shutdown": 5,
        "log_level": settings.log_level,
        "access_log": False,  # one line per request costs more than the request (see bench/)
        **overrides,
    }
    return uvicorn.Config(StartDelay(asgi, shedder) if shedder is not None else asgi, **options)


def raise_file_limit() -> None:
    """Use the hard limit on open files: each connection is a descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(app: Any, settings: Settings, **overrides: Any) -> None:
    """Run the gateway until SIGTERM/SIGINT (then drain and stop)."""
    raise_file_limit()

    runtime = runtime_of(app)
    if runtime is None:
        raise TypeError("serve() runs a laneway app (create_app)")
    server = GatewayServer(
        server_config(app, settings, **overrides), runtime, accept_fanout=settings.http_accept_fanout
    )
    server.run()
