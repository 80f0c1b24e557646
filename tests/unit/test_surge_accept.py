"""server.SurgeAcceptors: under uvloop a listening socket yields one new connection per loop
turn; while connections queue up unaccepted, more watchers of it take several a turn, and they
go again once the queue stays empty.

The loop is kept busy the way a loaded gateway's is: each connection_made costs 2 ms. Turns are
counted by a callback that re-schedules itself (call_soon runs once per iteration)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from laneway.core.loop_lag import LoopLagMonitor
from laneway.server import SurgeAcceptors
from support import until

uvloop = pytest.importorskip("uvloop")

CONNECTIONS = 48


class Busy(asyncio.Protocol):
    made: list[int]  # the turn each connection was made in
    turn = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Busy.made.append(Busy.turn)
        time.sleep(0.002)  # a loaded loop: every turn takes a while
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        pass


async def ticking(acceptors: SurgeAcceptors) -> LoopLagMonitor:
    """The runtime's periodic tick (every 5 ms here, 50 ms in the gateway) driving the acceptors."""
    monitor = LoopLagMonitor(interval_s=0.005)
    monitor.subscribe(acceptors.tick)
    await monitor.start()
    return monitor


async def accept_burst(surge: bool) -> tuple[int, SurgeAcceptors | None]:
    """Open CONNECTIONS connections while the loop is blocked; -> (turns to accept them all, surge)."""
    loop = asyncio.get_running_loop()
    Busy.made, Busy.turn = [], 0
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = await loop.create_server(Busy, sock=listener, backlog=1024)
    fd = next(iter(server.sockets)).fileno()
    acceptors = SurgeAcceptors(fd, Busy, extra=7, backlog=1024, calm_s=0.05) if surge else None
    monitor = await ticking(acceptors) if acceptors is not None else None
    port = listener.getsockname()[1]
    clients = []
    try:
        for _ in range(CONNECTIONS):  # the kernel completes them; nobody accepts yet
            clients.append(socket.create_connection(("127.0.0.1", port)))
        if acceptors is not None:
            assert acceptors.queued() == CONNECTIONS  # what the ticks read

        def count_turn() -> None:
            Busy.turn += 1
            if len(Busy.made) < CONNECTIONS:
                loop.call_soon(count_turn)

        loop.call_soon(count_turn)
        await until(lambda: len(Busy.made) >= CONNECTIONS, step=0.001, what="every connection made")
        return Busy.made[-1] - Busy.made[0] + 1, acceptors
    finally:
        if monitor is not None:
            await monitor.stop()
        for c in clients:
            c.close()
        server.close()


def run(coro: object) -> object:
    return uvloop.run(coro)  # type: ignore[no-any-return]


def test_without_help_uvloop_accepts_one_connection_a_turn() -> None:
    """The premise: if a libuv takes several a turn one day, SurgeAcceptors can go."""
    turns, _ = run(accept_burst(surge=False))  # type: ignore[misc]
    assert turns >= CONNECTIONS


def test_a_queue_of_connections_is_accepted_several_a_turn_then_the_copies_close() -> None:
    async def scenario() -> None:
        turns, acceptors = await accept_burst(surge=True)
        assert acceptors is not None
        monitor = await ticking(acceptors)
        try:
            assert turns < CONNECTIONS // 2, turns  # one a turn until the first tick, then up to 8
            assert acceptors.surges == 1
            assert acceptors.queued() == 0
            # the queue stays empty past calm_s: back to one watcher
            await until(lambda: not acceptors.active, within=5, step=0.01, what="the copies closed")
        finally:
            await monitor.stop()
            acceptors.close()

    run(scenario())


def test_a_short_queue_opens_nothing() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        sock = next(iter(server.sockets))
        acceptors = SurgeAcceptors(sock.fileno(), asyncio.Protocol, extra=7, backlog=128)
        monitor = await ticking(acceptors)
        clients = [socket.create_connection(sock.getsockname()[:2]) for _ in range(2)]
        try:
            await asyncio.sleep(0.05)  # ten ticks: what queued was accepted at once
            assert not acceptors.active and acceptors.surges == 0
        finally:
            await monitor.stop()
            acceptors.close()
            for c in clients:
                c.close()
            server.close()

    run(scenario())


def test_without_tcp_info_the_acceptors_turn_themselves_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform without socket.TCP_INFO (not Linux): tick() neither raises nor opens copies,
    however many connections wait; the one watcher goes on accepting them."""
    monkeypatch.delattr(socket, "TCP_INFO", raising=False)

    async def scenario() -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        acceptors = SurgeAcceptors(listener.fileno(), asyncio.Protocol, extra=7, backlog=128, threshold=1)
        clients = [socket.create_connection(listener.getsockname()) for _ in range(4)]  # queued: none accepts
        try:
            assert not acceptors.enabled
            for _ in range(3):
                acceptors.tick()
            await asyncio.sleep(0)
            assert acceptors.queued() == 0 and acceptors.last_queued == 0
            assert not acceptors.active and acceptors.surges == 0
        finally:
            acceptors.close()
            for c in clients:
                c.close()
            listener.close()

    run(scenario())


def test_a_listener_that_refuses_tcp_info_turns_them_off() -> None:
    """getsockopt(TCP_INFO) failing (here: a Unix socket) turns the probe off at the first tick."""

    async def scenario() -> None:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(f"\0laneway-surge-{id(listener)}")
        listener.listen(16)
        acceptors = SurgeAcceptors(listener.fileno(), asyncio.Protocol, extra=7, backlog=16)
        try:
            assert acceptors.enabled
            acceptors.tick()
            assert not acceptors.enabled and not acceptors.active
            acceptors.tick()  # and stays off, quietly
            assert acceptors.queued() == 0
        finally:
            acceptors.close()
            listener.close()

    run(scenario())
