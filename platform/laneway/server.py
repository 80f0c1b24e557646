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

- load shedding: while too many requests are being prepared or the event loop runs behind
  (core/load_shedding.py), a new /v1 request is answered with a prepared 503 `overloaded`
  right after its headers, before the app.
- the generation routes below Litestar: POST /v1/completions and /v1/chat/completions are
  served by api/fast.py's plain-ASGI route (the same handlers, errors and headers; Litestar's
  per-request layers cost as much CPU as the request's own work), unless tracing is on.

uvicorn's own `limit_concurrency` caps connections (503 beyond), `timeout_keep_alive`
closes idle ones. `GatewayServer` turns the first SIGTERM/SIGINT into a drain (stop
admitting, finish or cut what runs, flush usage) before uvicorn stops; a second signal
falls through to uvicorn's own handling.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from laneway.api.errors import ErrorHandlers
from laneway.api.fast import FastRoutes
from laneway.api.request_ids import HEADER as REQUEST_ID_HEADER
from laneway.api.request_ids import fresh_request_id, sane_request_id, sent_request_id
from laneway.contracts.scope import ABORT_EXTENSION, DISCONNECT_EXTENSION
from laneway.core import load_shedding
from laneway.core.load_shedding import LoadShedder, Preparing
from laneway.metrics import Reading
from laneway.runtime import Runtime, runtime_of
from laneway.settings import Settings

log = logging.getLogger("laneway.server")

_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_OVERLOADED_BODY = (
    b'{"error": {"message": "The gateway is overloaded; retry shortly.", "type": "service_unavailable", '
    b'"param": null, "code": "overloaded"}}'
)
_OVERLOADED_HEAD = (  # then the X-Request-Id, as on every response (api/request_ids.py)
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"content-length: " + str(len(_OVERLOADED_BODY)).encode() + b"\r\nx-request-id: "
)
_OVERLOADED_TAIL = b"\r\n\r\n" + _OVERLOADED_BODY
RECEIVED_AT = "laneway.received_at"  # scope key: when the request's headers were parsed
PREPARING = "laneway.preparing"  # scope key: an API request's load_shedding.Preparing token


class CorkedTransport:
    """A connection's transport as the protocol and its requests' cycles see it: what is
    written during one loop turn goes out together at the turn's end, in one system call.

    uvicorn writes a response's head and its body separately, so a whole answer ready at
    once cost two system calls, two TCP segments and two wake-ups of the client. Order is
    kept (everything goes through here); `close` sends what is held first, `abort` drops it.
    Past `hold_bytes` held, a write goes out at once: the real transport must see a large
    response's bytes to pause its writer (uvicorn's flow control), or a handler that writes
    in a loop without yielding would pile them up here.
    """

    __slots__ = ("_held", "_loop", "_pending", "transport")
    hold_bytes = 64 * 1024

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._held = 0

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)
        self._held += len(data)
        if self._held >= self.hold_bytes:
            self.flush()

    def write_now(self, data: bytes) -> None:
        """A write that needs no corking (a whole answer): straight to the transport, without
        the end-of-turn callback, unless writes are held (they go first)."""
        if self._pending:
            self.write(data)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._held = 0
        if self.transport.is_closing():
            return  # the client is gone (or the connection was cut): nothing to send to
        if len(pending) == 1:
            self.transport.write(pending[0])
        else:
            self.transport.writelines(pending)  # uvloop: one writev, no copy

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self._pending = []
        self._held = 0
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + self._held

    def __getattr__(self, name: str) -> Any:  # the rest (get_extra_info, set_protocol, ...) as is
        return getattr(self.transport, name)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request read timeout and a capped send buffer."""

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
        request in one read on an idle keep-alive connection. Refusing costs the loop the most
        at 5x (six refusals a success), and uvicorn's path (its parser callbacks, the scope, the
        timers) cost ~30 us of it. Anything unusual (a body still to come, a second request
        behind it, chunked, Expect, an odd header line) returns False, before the shedder is
        asked, for the parser to handle; so does a request the shedder lets in (marked, so that
        it is not asked twice). True: answered 503 here."""
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # an answer is still going out: this request waits its turn
        shedder = self.shedder
        assert shedder is not None
        if shedder.calm():
            return False  # it will be let in: no need to read its headers here (the parser does)
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = data[:end].split(b"\r\n")
        if not lines[0].endswith(b" HTTP/1.1"):
            return False
        length, rid, close = 0, None, False
        seen_length = False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name[-1:] in (b" ", b"\t") or line[:1] in (b" ", b"\t"):
                return False
            name, value = name.lower(), value.strip(b" \t")
            if name == b"content-length":
                if seen_length or not value.isdigit():
                    return False
                length, seen_length = int(value), True
            elif name in (b"transfer-encoding", b"expect", b"upgrade"):
                return False
            elif name == b"connection":
                close = value.lower() == b"close"
            elif name == REQUEST_ID_HEADER:
                rid = value
        if end + 4 + length != len(data):
            return False
        shedder.arrived()
        if shedder.refusal() is None:
            self._admitted = True
            return False
        self._disarm()
        self._answer_overloaded(rid if rid is not None and sane_request_id(rid) else None)
        self.server_state.total_requests += 1
        if close:
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
        """The prepared 503, with the client's (sane) request id or a fresh one: written at once
        (one write, nothing to cork), unless this turn's writes are held (order)."""
        answer = _OVERLOADED_HEAD + (request_id or fresh_request_id().encode()) + _OVERLOADED_TAIL
        cast(CorkedTransport, self.transport).write_now(answer)

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
            self.transport.write(_TIMEOUT_RESPONSE)
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


class StartDelay:
    """ASGI wrapper: how long each request waited between its headers and its first step in
    the app, i.e. how far behind the event loop runs (fed to the load shedder); and the
    request's Preparing token made current for its task, so the pipeline can end it."""

    def __init__(self, app: Any, shedder: LoadShedder) -> None:
        self.app = app
        self.shedder = shedder

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        received = scope.get(RECEIVED_AT)
        if received is not None:
            self.shedder.observe(time.perf_counter() - received)
        token = scope.get(PREPARING)
        if token is None:
            await self.app(scope, receive, send)
            return
        load_shedding.current.set(token)  # this task's own context: no reset needed
        try:
            await self.app(scope, receive, send)
        finally:
            token.done()


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    runtime = runtime_of(app)  # None: another ASGI app (a test's stand-in engine), no load shedding
    shedder = runtime.shedder if runtime is not None else None
    asgi = app
    if runtime is not None and runtime.tracing is None:  # traced requests need Litestar's middleware
        asgi = FastRoutes(app, runtime.provide_api, ErrorHandlers(runtime.metrics))
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": protocol_for(settings, shedder),
        "limit_concurrency": settings.http_max_connections,
        "backlog": settings.http_backlog,
        "timeout_keep_alive": settings.http_keep_alive_s,
        # The drain (GatewayServer) has already finished or cut every request by then.
        "timeout_graceful_shutdown": 5,
        "log_level": settings.log_level,
        "access_log": False,  # one line per request costs more than the request (see bench/)
        **overrides,
    }
    return uvicorn.Config(StartDelay(asgi, shedder) if shedder is not None else asgi, **options)


class GatewayServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the gateway before the server stops."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime, *, accept_fanout: int = 1) -> None:
        super().__init__(config)
        self._runtime = runtime
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accept_fanout = accept_fanout
        self._surge: SurgeAcceptors | None = None
        self._unsubscribe: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        listening = [sock for server in self.servers for sock in (server.sockets or ())]
        if self._accept_fanout > 1 and len(listening) == 1 and listening[0].family in (socket.AF_INET, socket.AF_INET6):
            config = self.config

            def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
                # as uvicorn's startup makes them (a function local to it)
                return config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop
                )

            self._surge = SurgeAcceptors(
                listening[0].fileno(), create_protocol, extra=self._accept_fanout - 1, backlog=config.backlog,
                ssl=config.ssl,
            )  # fmt: skip
            # Checked on the runtime's loop-lag tick (it starts with the lifespan, done by now).
            self._unsubscribe = self._runtime.loop_lag.subscribe(self._surge.tick)
            self._runtime.metrics.watch(self._surge.readings)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._surge is not None:
            self._surge.close()
        await super().shutdown(sockets)

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
            await self._runtime.drain()
        except Exception:
            log.exception("draining failed; shutting down anyway")
        finally:
            self.should_exit = True


class SurgeAcceptors:
    """More watchers of the listening socket while connections queue up in the kernel.

    libuv (under uvloop) accepts one connection per readiness of a listening descriptor, so one
    per loop turn. When clients open connections faster than that while the loop is busy (a
    surge, or 5x capacity), the connections wait in the kernel's accept queue, for hundreds of
    milliseconds, before anything can answer them, even a refusal (bench/overhead.py at 5x:
    refusals' p99 0.5-1.3 s, all on new connections). So the queue's length is read (TCP_INFO
    of the listening socket) on every tick of the runtime's loop-lag monitor (50 ms; a timer of
    its own cost an idle gateway 0.25 % of a core); from `threshold` queued connections on, `extra`
    duplicates of its descriptor are watched too, each accepting one a turn, until the queue has
    been empty for `calm_s`. Not always on: each new connection would wake every copy, and the
    copies' failed accepts cost ~0.1 ms per connection with 8 of them (measured with one request
    a connection). During a surge more is better: at 5x, 32 watchers took the refusals' p99 to
    ~85 ms, 8 to 0.35-0.5 s, 1 left it at 1.2-1.3 s (bench/overhead.py, interleaved runs).
    """

    def __init__(
        self,
        fd: int,
        protocol_factory: Callable[..., asyncio.Protocol],
        *,
        extra: int,
        backlog: int,
        ssl: Any = None,
        calm_s: float = 2.0,
        threshold: int = 4,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._probe = socket.socket(fileno=os.dup(fd))  # for TCP_INFO, and the source of the copies
        self._factory = protocol_factory
        self._extra, self._backlog, self._ssl = extra, backlog, ssl
        self._calm_s, self._threshold = calm_s, threshold
        self._servers: list[asyncio.Server] = []
        self._opening: asyncio.Task[None] | None = None
        self._busy_at = 0.0
        self.last_queued = 0
        self.surges = 0  # times the copies were opened

    @property
    def active(self) -> bool:
        return bool(self._servers)

    def queued(self) -> int:
        """Connections set up by the kernel and not accepted yet (tcpi_unacked of a listening socket)."""
        info = self._probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
        return int.from_bytes(info[24:28], "little")

    def tick(self, _lag: float = 0.0) -> None:
        try:
            queued = self.last_queued = self.queued()
        except OSError:
            return
        now = self.loop.time()
        if queued:
            self._busy_at = now
        if queued >= self._threshold and not self._servers and self._opening is None:
            self._opening = self.loop.create_task(self._open())
        elif not queued and self._servers and now - self._busy_at > self._calm_s:
            self._close_copies()

    async def _open(self) -> None:
        try:
            for _ in range(self._extra):
                copy = socket.socket(fileno=os.dup(self._probe.fileno()))
                try:
                    server = await self.loop.create_server(
                        self._factory, sock=copy, backlog=self._backlog, ssl=self._ssl
                    )
                except BaseException:
                    copy.close()
                    raise
                self._servers.append(server)  # closing it closes the copy
            self.surges += 1
        except OSError as exc:  # out of descriptors, say: the one watcher goes on
            log.warning("could not watch the listening socket more than once: %s", exc)
        finally:
            self._opening = None

    def readings(self) -> list[Reading]:
        return [
            ("laneway_accept_queue", "New connections the kernel holds that the server has not accepted yet "
             "(at the last 50 ms tick).", "gauge", {}, self.last_queued),
            ("laneway_accept_surges_total", "Times the listening socket was watched through more descriptors "
             "because new connections queued up unaccepted.", "counter", {}, self.surges),
        ]  # fmt: skip

    def _close_copies(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()

    def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        self._close_copies()
        self._probe.close()


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
