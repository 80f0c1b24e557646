"""The HTTP server laneway runs under: uvicorn (httptools parser), plus the guards it lacks.

Why uvicorn: docs/decisions/0001-http-server.md. The guards (a request read timeout, the
connection cap, load shedding and refusals at the door, stalled-stream aborts, surge
acceptors): docs/decisions/0004-server-guards.md.

- uvicorn_fence: the only module that touches uvicorn's non-public API (the guarded
  protocol, the server's hooks);
- refusals: the answers written before any app sees a request;
- corked_transport: one system call per loop turn and connection;
- surge_acceptors: more watchers of the listening socket while connections queue up;
- gateway_server: drain on the first exit signal, the surge acceptors wired in;
- start_delay: the load shedder's view of how far behind the loop runs;
- run: the configuration and serve().
"""

from __future__ import annotations

from laneway.contracts.scope import PREPARING, RECEIVED_AT
from laneway.server.corked_transport import CorkedTransport
from laneway.server.gateway_server import GatewayServer
from laneway.server.run import raise_file_limit, serve, server_config
from laneway.server.start_delay import StartDelay
from laneway.server.surge_acceptors import AcceptQueueProbe, SurgeAcceptors
from laneway.server.uvicorn_fence import GuardedHttpProtocol, protocol_for

__all__ = [
    "PREPARING",
    "RECEIVED_AT",
    "AcceptQueueProbe",
    "CorkedTransport",
    "GatewayServer",
    "GuardedHttpProtocol",
    "StartDelay",
    "SurgeAcceptors",
    "protocol_for",
    "raise_file_limit",
    "serve",
    "server_config",
]
