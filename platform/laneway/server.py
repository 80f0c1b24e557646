"""The HTTP server laneway runs under: uvicorn (httptools parser), plus the guards it lacks.

Why uvicorn and not Granian or Hypercorn: it is what the tests embed in-process (one
event loop shared with the app's state), its httptools parser is fast, and the two things
missing for hostile clients are small to add here:

- a request read timeout: uvicorn has none for headers, so a slowloris client that sends
  a header byte every few seconds holds its connection (and a file descriptor) forever.
  `GuardedHttpProtocol` closes a connection whose request (headers and body) has not fully
  arrived within `http_request_read_timeout_s` (408 when no request has started yet);
- an abort for stalled streams: the ASGI scope carries the transport's abort() so a
  stream whose client stopped reading is cut, not left holding buffered bytes; and the
  socket's send buffer is capped, so a client that stops reading blocks the stream after
  tens of kilobytes, not megabytes.

uvicorn's own `limit_concurrency` caps connections (503 beyond), `timeout_keep_alive`
closes idle ones. `GatewayServer` turns the first SIGTERM/SIGINT into a drain (stop
admitting, finish or cut what runs, flush usage) before uvicorn stops; a second signal
falls through to uvicorn's own handling.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from laneway.api.responses import ABORT_EXTENSION
from laneway.settings import Settings

log = logging.getLogger("laneway.server")

_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request read timeout and a capped send buffer."""

    read_timeout_s: float = 10.0
    send_buffer_bytes: int = 64 * 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and self.send_buffer_bytes:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
            except OSError:  # not a TCP socket (a test transport): nothing to cap
                pass
        self._arm()  # a connection that never sends a request is closed too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions: Any = {ABORT_EXTENSION: self.transport.abort}
        self.scope["extensions"] = extensions
        self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._read_timer is None and self.read_timeout_s > 0:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # no request is being served
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()  # a handler waiting for the body sees a disconnect


def protocol_for(settings: Settings) -> type[GuardedHttpProtocol]:
    """The protocol class with this gateway's limits (uvicorn takes a class, not an instance)."""
    return type(
        "LanewayHttpProtocol",
        (GuardedHttpProtocol,),
        {"read_timeout_s": settings.http_request_read_timeout_s},
    )


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": protocol_for(settings),
        "limit_concurrency": settings.http_max_connections,
        "timeout_keep_alive": settings.http_keep_alive_s,
        # The drain (GatewayServer) has already finished or cut every request by then.
        "timeout_graceful_shutdown": 5,
        "log_level": settings.log_level,
        "access_log": False,  # one line per request costs more than the request (see bench/)
        **overrides,
    }
    return uvicorn.Config(app, **options)


class GatewayServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the gateway before the server stops."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None or self._loop is None or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: uvicorn's own (forced) exit
            return
        log.info("received %s: draining before shutdown", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain_then_exit(), name="drain")

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain()
        except Exception:
            log.exception("draining failed; shutting down anyway")
        finally:
            self.should_exit = True


def raise_file_limit() -> None:
    """Use the hard limit on open files: each connection is a descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(app: Any, settings: Settings, **overrides: Any) -> None:
    """Run the gateway until SIGTERM/SIGINT (then drain and stop)."""
    raise_file_limit()

    async def drain() -> None:
        await app.state.drain()

    server = GatewayServer(server_config(app, settings, **overrides), drain)
    server.run()
