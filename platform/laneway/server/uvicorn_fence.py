"""The one module that touches uvicorn's non-public API: laneway's HTTP/1 protocol (a subclass of
uvicorn's httptools protocol, with the guards uvicorn lacks) and the hooks of its server.

Why a fence: uvicorn documents its Config, Server.run/serve and the command line, not its
protocol classes. What laneway relies on beyond that is named in the contract below;
tests/unit/test_uvicorn_fence.py fails when uvicorn changes any of it, and pyproject.toml
pins uvicorn to the minor range that test passed on (docs/decisions/0001-http-server.md).
Nothing else in laneway imports from uvicorn's submodules or reads uvicorn's state; the rest
of the server package sees plain hooks (FencedServer) and plain data (server/refusals.py).

The guards, per connection (docs/decisions/0004-server-guards.md):
- a request read timeout: uvicorn has none for headers, so a slowloris client that sends a
  header byte every few seconds would hold its connection (and a descriptor) forever. A
  connection whose request (headers and body) has not fully arrived within `read_timeout_s`
  is closed (408 when no request has started yet);
- load shedding at the door: while the shedder refuses, a new /v1 request is answered with a
  prepared 503 `overloaded` right after its headers (or, for a whole request in one read on an
  idle connection, before the parser), never reaching the app;
- an abort for stalled streams and a disconnect watch in the ASGI scope's extensions, and a
  capped socket send buffer, so a client that stops reading blocks its stream early;
- a CorkedTransport under the protocol and its cycles (one system call per loop turn).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from laneway.api.request_ids import sane_request_id, sent_request_id
from laneway.contracts.scope import ABORT_EXTENSION, DISCONNECT_EXTENSION, PREPARING, RECEIVED_AT
from laneway.core.load_shedding import LoadShedder, Preparing
from laneway.server.corked_transport import CorkedTransport
from laneway.server.refusals import TIMEOUT_RESPONSE, overloaded_answer, whole_request
from laneway.settings import Settings

# The contract: everything of uvicorn's beyond its documented API that this module uses.
PROTOCOL_CONSTRUCTOR = ("config", "server_state", "app_state", "_loop")  # the factory rebuilt below
PROTOCOL_OVERRIDES = (  # HttpToolsProtocol's methods GuardedHttpProtocol overrides (and calls up to)
    "connection_made",
    "data_received",
    "connection_lost",
    "on_message_begin",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "timeout_keep_alive_handler",
)
PROTOCOL_STATE = ("loop", "transport", "cycle", "server_state", "timeout_keep_alive", "timeout_keep_alive_task")
REQUEST_STATE = ("scope", "url", "headers")  # set by on_message_begin / the parser's callbacks
CYCLE_STATE = ("response_complete", "disconnected")  # RequestResponseCycle's, read and written
SERVER_STATE_FIELDS = ("total_requests",)  # uvicorn.server.ServerState's
SERVER_OVERRIDES = ("startup", "main_loop", "shutdown", "handle_exit")  # uvicorn.Server's
SERVER_CALLS = ("on_tick",)  # uvicorn.Server's, called with a counter whose multiples of 10 refresh the Date header
SERVER_ATTRIBUTES = ("servers", "server_state", "lifespan", "should_exit", "started")
CONFIG_ATTRIBUTES = ("http_protocol_class", "backlog", "ssl", "timeout_keep_alive")


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request read timeout, refusals at the door and a
    capped send buffer."""

    read_timeout_s: float = 10.0
    send_buffer_bytes: int = 64 * 1024
    shedder: LoadShedder | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_timer: asyncio.TimerHandle | None = None
        self._shedding = False
        self._preparing: Preparing | None = None  # the current API request's, until it queues or ends
        self._on_lost: Callable[[], None] | None = None  # api/disconnect.py's watcher of this request
        self._lost = False
        self._between = True  # the parser is between two requests (none begun)
        self._admitted = False  # the shedder let this request in already (refuse_whole)
        self._refused_at = -1e9  # when _refuse_whole last answered (the keep-alive counts from it)
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, CorkedTransport(transport, self.loop))  # the cycles' too
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                # asyncio sets TCP_NODELAY only on sockets it made with proto IPPROTO_TCP; one
                # handed over pre-bound (tests, systemd) would wait ~40 ms on delayed ACKs.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.send_buffer_bytes:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
            except OSError:  # not a TCP socket (a test transport): nothing to set
                pass
        self._arm()  # a connection that never sends a request is closed too

    def data_received(self, data: bytes) -> None:
        if self.shedder is not None and self._between and data.startswith(b"POST /v1/") and self._refuse_whole(data):
            return
        super().data_received(data)

    def _refuse_whole(self, data: bytes) -> bool:
        """A refusal without the parser, for the common case under overload: one whole API
        request in one read on an idle keep-alive connection. Refusing is most of the loop's
        work far past capacity, and uvicorn's path (its parser callbacks, the scope, the timers)
        is most of a refusal's cost. Anything unusual returns False (refusals.whole_request),
        before the shedder is asked, for the parser to handle; so does a request the shedder
        lets in (marked, so that it is not asked twice). True: answered 503 here."""
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # an answer is still going out: this request waits its turn
        shedder = self.shedder
        assert shedder is not None
        if shedder.calm():
            return False  # it will be let in: no need to read its headers here (the parser does)
        request = whole_request(data)
        if request is None:
            return False
        shedder.arrived()
        if shedder.refusal() is None:
            self._admitted = True
            return False
        self._disarm()
        rid = request.request_id
        self._answer_overloaded(rid if rid is not None and sane_request_id(rid) else None)
        self.server_state.total_requests += 1
        if request.close:
            self.transport.close()
        else:
            self._keep_alive_after_refusal()
        return True

    def _keep_alive_after_refusal(self) -> None:
        """Keep-alive as uvicorn's on_response_complete arms it after any answer (nothing is
        pipelined or paused here), but without a new timer for each refusal under a flood (a
        cancel and a call_later each): the timer armed after the connection's last answer
        stays, and when it fires it counts the idle time from the last refusal instead."""
        self._refused_at = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def timeout_keep_alive_handler(self) -> None:
        idle_for = self.loop.time() - self._refused_at
        if idle_for < self.timeout_keep_alive:  # a refusal since the timer was armed
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive - idle_for, self.timeout_keep_alive_handler
            )
            return
        super().timeout_keep_alive_handler()

    def on_message_begin(self) -> None:
        self._between = False
        super().on_message_begin()
        extensions: Any = {ABORT_EXTENSION: self._abort_stream, DISCONNECT_EXTENSION: self._watch_disconnect}
        self.scope["extensions"] = extensions
        self._arm()

    def on_headers_complete(self) -> None:
        shedder = self.shedder
        scope: Any = self.scope
        admitted, self._admitted = self._admitted, False
        if shedder is not None and self.url.startswith(b"/v1/"):
            if not admitted:
                shedder.arrived()
            if self.cycle is None or self.cycle.response_complete:  # else: nothing to answer before it
                if not admitted and shedder.refusal() is not None:
                    self._shedding = True  # its body, if any, is read and dropped
                    self._answer_overloaded(sent_request_id(self.headers))
                    return
                self._end_preparing()
                self._preparing = scope[PREPARING] = Preparing(shedder, counting=False)  # from its body's end
        scope[RECEIVED_AT] = time.perf_counter()
        super().on_headers_complete()

    def _answer_overloaded(self, request_id: bytes | None) -> None:
        """The prepared 503, written at once (one write, nothing to cork), unless this turn's
        writes are held (order)."""
        cast(CorkedTransport, self.transport).write_now(overloaded_answer(request_id))

    def on_body(self, body: bytes) -> None:
        if not self._shedding:
            super().on_body(body)

    def on_response_complete(self) -> None:
        self._end_preparing()
        super().on_response_complete()

    def _end_preparing(self) -> None:
        if self._preparing is not None:
            self._preparing.done()
            self._preparing = None

    def on_message_complete(self) -> None:
        self._between = True
        self._disarm()
        if self._preparing is not None:
            self._preparing.start()  # the whole body is here: the loop owes it work now
        if self._shedding:
            self._shedding = False
            self.on_response_complete()  # keep-alive as after any answer
            return
        super().on_message_complete()

    def _abort_stream(self) -> None:
        """Cut a stalled stream's connection. Marked disconnected first: the app then returns
        mid-response on purpose, which uvicorn would otherwise log as an application error."""
        if self.cycle is not None:
            self.cycle.disconnected = True
        self.transport.abort()

    def _watch_disconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when the connection is lost (now, if it already is); -> unwatch."""
        if self._lost:
            callback()
            return _nothing
        self._on_lost = callback

        def unwatch() -> None:
            if self._on_lost is callback:
                self._on_lost = None

        return unwatch

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._end_preparing()
        self._lost = True
        super().connection_lost(exc)
        callback, self._on_lost = self._on_lost, None
        if callback is not None:  # uvicorn has marked the cycle disconnected
            callback()

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
            self.transport.write(TIMEOUT_RESPONSE)
        self.transport.close()  # a handler waiting for the body sees a disconnect


def _nothing() -> None:
    pass


def protocol_for(settings: Settings, shedder: LoadShedder | None = None) -> type[GuardedHttpProtocol]:
    """The protocol class with this gateway's limits (uvicorn takes a class, not an instance)."""
    return type(
        "LanewayHttpProtocol",
        (GuardedHttpProtocol,),
        {"read_timeout_s": settings.http_request_read_timeout_s, "shedder": shedder},
    )


ProtocolFactory = Callable[..., asyncio.Protocol]
# uvicorn's main loop ticks every 0.1 s to see whether it should exit (and, one tick in ten, to
# refresh the Date header): ten wake-ups a second of an idle gateway. Once a second does the
# header; an exit asked for wakes the loop at once instead of waiting for a tick.
TICK_S = 1.0


class FencedServer(uvicorn.Server):
    """uvicorn.Server with hooks on its start, stop and exit signals that see no uvicorn
    internals: the listening sockets and a protocol factory, a signal number."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._tick_loop: asyncio.AbstractEventLoop | None = None
        self._tick_wake: asyncio.Event | None = None  # set: the main loop ticks now

    def on_starting(self) -> None:
        """On the server's loop, before the lifespan starts."""

    def on_started(self, listening: list[socket.socket], protocol_factory: ProtocolFactory) -> None:
        """Listening: the sockets, and a factory of protocols like those uvicorn made for them."""

    def on_stopping(self) -> None:
        """Before the server stops listening and shuts its connections down."""

    def on_exit_signal(self, sig: int) -> bool:
        """The first exit signal (from a signal handler); True: taken care of, uvicorn does not
        exit yet (a later request_exit() does); False: uvicorn's own handling."""
        return False

    def request_exit(self) -> None:
        """Stop as after an exit signal: the main loop ends now, then shutdown (from any
        thread, or a signal handler)."""
        self.should_exit = True
        self._wake_main_loop()

    def _wake_main_loop(self) -> None:
        wake, loop = self._tick_wake, self._tick_loop
        if wake is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def main_loop(self) -> None:
        """uvicorn's main loop with one tick a second: each tick refreshes the Date header
        (counter 0) and returns True once the server should exit."""
        self._tick_loop = asyncio.get_running_loop()
        self._tick_wake = wake = asyncio.Event()
        while not await self.on_tick(0):
            wake.clear()
            if self.should_exit:  # set between the tick's check and the clear
                continue
            try:
                async with asyncio.timeout(TICK_S):
                    await wake.wait()
            except TimeoutError:
                pass

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_starting()
        await super().startup(sockets)
        listening = [sock for server in self.servers for sock in (server.sockets or ())]
        config = self.config

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            # as uvicorn's startup makes them (a function local to it)
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop
            )

        self.on_started(listening, create_protocol)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_stopping()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit or not self.on_exit_signal(sig):
            super().handle_exit(sig, frame)
            self._wake_main_loop()


def server_started(server: uvicorn.Server) -> bool:
    """Whether `server` is listening (its startup has finished)."""
    return server.started


def stop_server(server: uvicorn.Server) -> None:
    """Have `server` stop as after an exit signal (from any thread)."""
    if isinstance(server, FencedServer):
        server.request_exit()
    else:
        server.should_exit = True
