"""The contract of server/uvicorn_fence.py with uvicorn: everything laneway uses beyond uvicorn's
documented API is still there, in the shape the fence expects. A new uvicorn that renames a
callback, drops an attribute or changes the protocol factory's arguments fails here, before a
gateway misbehaves; then the fence is updated and the pin in pyproject.toml moved."""

from __future__ import annotations

import asyncio
import inspect
import re
import socket
import time
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import uvicorn
from laneway.server import uvicorn_fence
from laneway.server.uvicorn_fence import FencedServer, GuardedHttpProtocol, ProtocolFactory, protocol_for
from laneway.settings import Settings
from packaging.requirements import Requirement
from support import until
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "platform" / "laneway"


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_installed_uvicorn_is_in_the_pinned_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [Requirement(line) for line in project["dependencies"] if Requirement(line).name == "uvicorn"]
    assert len(pins) == 1
    assert pins[0].specifier.contains(version("uvicorn")), (pins[0], version("uvicorn"))
    upper = [spec for spec in pins[0].specifier if spec.operator == "<"]
    assert upper, "uvicorn's internals are used: its range needs an upper bound"


def test_the_protocol_factory_takes_what_the_fence_passes() -> None:
    assert parameters(HttpToolsProtocol.__init__) == ["self", *uvicorn_fence.PROTOCOL_CONSTRUCTOR]


def test_every_override_is_listed_and_matches_uvicorns_method() -> None:
    ours = {name for name in vars(GuardedHttpProtocol) if hasattr(HttpToolsProtocol, name) and name[:2] != "__"}
    assert ours == set(uvicorn_fence.PROTOCOL_OVERRIDES), "an override (or a name clash) not in the contract"
    for name in uvicorn_fence.PROTOCOL_OVERRIDES:
        theirs = getattr(HttpToolsProtocol, name)
        assert callable(theirs), name
        assert parameters(getattr(GuardedHttpProtocol, name)) == parameters(theirs), name


def test_the_server_hooks_wrap_uvicorns_methods() -> None:
    ours = {name for name in vars(FencedServer) if hasattr(uvicorn.Server, name) and name[:2] != "__"}
    assert ours == set(uvicorn_fence.SERVER_OVERRIDES)
    for name in uvicorn_fence.SERVER_OVERRIDES:
        assert parameters(getattr(FencedServer, name)) == parameters(getattr(uvicorn.Server, name)), name


class Transport(asyncio.Transport):
    """A connection that records what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 4000), "sockname": ("127.0.0.1", 8000)}.get(name, default)


async def hello(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"hi"})


class Watching(HttpToolsProtocol):
    """uvicorn's protocol, recording its request state where the fence reads it."""

    seen: dict[str, Any]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.seen = {"scope": self.scope}

    def on_headers_complete(self) -> None:
        self.seen["url"], self.seen["headers"] = self.url, list(self.headers)
        super().on_headers_complete()
        self.seen["cycle"] = self.cycle


def test_the_protocol_state_the_fence_reads_and_writes() -> None:
    """uvicorn's own protocol, driven through one request: the attributes the fence touches exist
    when it touches them, and mean what it takes them to mean."""

    async def scenario() -> None:
        config = uvicorn.Config(hello, log_level="warning", timeout_keep_alive=7)
        config.load()
        for name in uvicorn_fence.CONFIG_ATTRIBUTES:
            assert hasattr(config, name), name
        assert config.http_protocol_class is not None
        loop = asyncio.get_running_loop()
        state = ServerState()
        protocol = Watching(config=config, server_state=state, app_state={}, _loop=loop)
        transport = Transport()
        protocol.connection_made(transport)
        for name in uvicorn_fence.PROTOCOL_STATE:
            assert hasattr(protocol, name), name
        assert protocol.loop is loop and protocol.transport is transport and protocol.server_state is state
        assert protocol.cycle is None and protocol.timeout_keep_alive_task is None
        assert protocol.timeout_keep_alive == 7
        for name in uvicorn_fence.SERVER_STATE_FIELDS:
            assert isinstance(getattr(state, name), int), name

        protocol.data_received(b"GET /v1/x HTTP/1.1\r\nhost: a\r\nx-request-id: r1\r\n\r\n")
        await until(
            lambda: protocol.cycle is not None and protocol.cycle.response_complete, step=0, what="the response"
        )
        seen = protocol.seen
        assert seen["scope"]["type"] == "http" and isinstance(seen["scope"], dict)
        assert seen["url"] == b"/v1/x" and (b"x-request-id", b"r1") in seen["headers"]
        cycle = seen["cycle"]
        for name in uvicorn_fence.CYCLE_STATE:
            assert isinstance(getattr(cycle, name), bool), name
        assert cycle.response_complete and not cycle.disconnected
        assert bytes(transport.written).startswith(b"HTTP/1.1 200 OK") and transport.written.endswith(b"hi")
        assert state.total_requests == 1
        assert protocol.timeout_keep_alive_task is not None  # armed by on_response_complete
        protocol.timeout_keep_alive_task.cancel()
        protocol.connection_lost(None)
        assert cycle.disconnected is False  # complete: nothing to mark

    asyncio.run(scenario())


def test_the_server_hooks_and_the_rebuilt_protocol_factory() -> None:
    """A FencedServer started on a loopback socket: its hook sees the listening socket and a
    factory that builds the configured protocol as uvicorn's startup does."""
    started: list[tuple[list[Any], ProtocolFactory]] = []

    class Recording(FencedServer):
        def on_started(self, listening: list[socket.socket], protocol_factory: ProtocolFactory) -> None:
            started.append(([s.getsockname() for s in listening], protocol_factory))
            self.request_exit()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    address = sock.getsockname()  # the server closes the socket when it stops
    config = uvicorn.Config(
        hello, http=protocol_for(Settings()), lifespan="off", log_level="warning", timeout_graceful_shutdown=1
    )
    server = Recording(config)
    for name in ("should_exit", "started", "server_state"):
        assert hasattr(server, name), name
    assert uvicorn_fence.server_started(server) is False

    async def scenario() -> None:
        await server.serve(sockets=[sock])

    asyncio.run(scenario())
    for name in uvicorn_fence.SERVER_ATTRIBUTES:
        assert hasattr(server, name), name
    assert uvicorn_fence.server_started(server) is True
    ((listening, factory),) = started
    assert listening == [address]

    async def build() -> asyncio.Protocol:
        return factory(asyncio.get_running_loop())

    protocol = asyncio.run(build())
    assert isinstance(protocol, GuardedHttpProtocol) and type(protocol) is config.http_protocol_class
    assert protocol.server_state is server.server_state  # type: ignore[attr-defined]
    assert protocol.app_state is server.lifespan.state  # type: ignore[attr-defined]


def test_the_tick_the_main_loop_calls() -> None:
    for name in uvicorn_fence.SERVER_CALLS:
        assert parameters(getattr(uvicorn.Server, name)) == ["self", "counter"], name


def test_the_main_loop_ticks_once_a_second_and_an_exit_from_another_thread_ends_it_at_once() -> None:
    """uvicorn's main loop woke an idle gateway ten times a second; the fence's ticks once a
    second (refreshing the Date header each time) and an exit asked for does not wait for it."""
    ticks: list[int] = []

    class Counting(FencedServer):
        async def on_tick(self, counter: int) -> bool:
            ticks.append(counter)
            return await super().on_tick(counter)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        hello, http=protocol_for(Settings()), lifespan="off", log_level="warning", timeout_graceful_shutdown=1
    )
    server = Counting(config)

    async def scenario() -> float:
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        await until(lambda: uvicorn_fence.server_started(server), step=0.01, what="uvicorn started")
        await asyncio.sleep(0.7)  # time passing is the point: an idle server ticks no more
        assert ticks == [0]  # the first tick only, the Date header's refresh with it
        assert any(name == b"date" for name, _ in server.server_state.default_headers)
        asked = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, uvicorn_fence.stop_server, server)
        await serving
        return time.monotonic() - asked

    took = asyncio.run(scenario())
    assert took < 0.5, took  # not the rest of a second's tick (uvicorn's shutdown itself sleeps 0.1 s)
    assert ticks == [0, 0]


def test_nothing_outside_the_fence_reaches_into_uvicorn() -> None:
    """Elsewhere uvicorn is used only through its documented API (uvicorn.Config, uvicorn.Server)."""
    internal = re.compile(
        r"from uvicorn\.|import uvicorn\.|\.should_exit\b|\.server_state\b|\.timeout_keep_alive_task\b"
        r"|\.cycle\b|\.lifespan\.state\b|HttpToolsProtocol"
    )
    fence = PACKAGE / "server" / "uvicorn_fence.py"
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if path != fence
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if internal.search(line)
    ]
    assert not offenders, offenders
