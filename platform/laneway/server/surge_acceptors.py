"""More watchers of the listening socket while new connections queue up unaccepted, and the
probe of that queue (TCP_INFO, Linux) that turns itself off where the platform lacks it."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from laneway.metrics import Reading

log = logging.getLogger("laneway.server")

_TCPI_UNACKED = slice(24, 28)  # struct tcp_info's tcpi_unacked (Linux ABI): a listener's accept queue


class AcceptQueueProbe:
    """How many connections the kernel has set up on a listening socket that nobody has
    accepted yet. Linux tells through TCP_INFO; where `socket.TCP_INFO` is missing, or the
    socket refuses it, or the answer is too short to hold the field, the probe turns itself
    off (once, with a log line) and answers None from then on: the server then runs with its
    one watcher, as with `http_accept_fanout` 1."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._option: int | None = getattr(socket, "TCP_INFO", None)
        self.supported = True
        if self._option is None:
            self._turn_off("this platform has no socket.TCP_INFO")

    def read(self) -> int | None:
        option = self._option
        if not self.supported or option is None:
            return None
        try:
            info = self._sock.getsockopt(socket.IPPROTO_TCP, option, 32)
        except OSError as exc:
            self._turn_off(f"TCP_INFO of the listening socket failed ({exc})")
            return None
        if len(info) < _TCPI_UNACKED.stop:
            self._turn_off(f"TCP_INFO answered {len(info)} bytes")
            return None
        return int.from_bytes(info[_TCPI_UNACKED], "little")

    def _turn_off(self, why: str) -> None:
        self.supported = False
        log.info("accept-queue probe off, one watcher of the listening socket: %s", why)


class SurgeAcceptors:
    """More watchers of the listening socket while connections queue up in the kernel.

    libuv (under uvloop) accepts one connection per readiness of a listening descriptor, so one
    per loop turn. When clients open connections faster than that while the loop is busy (a
    surge, or far past capacity), they wait in the kernel's accept queue before anything can
    answer them, even a refusal. So the queue's length is read (AcceptQueueProbe) on every tick
    of the runtime's loop-lag monitor (a timer of its own would cost an idle gateway CPU); from
    `threshold` queued connections on, `extra` duplicates of its descriptor are watched too,
    each accepting one a turn, until the queue has been empty for `calm_s`. Not always on: each
    new connection wakes every copy, and the copies' failed accepts cost CPU per connection.
    During a surge more copies answer the queued sooner (docs/decisions/0004-server-guards.md).
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
        self._listener = socket.socket(fileno=os.dup(fd))  # for the probe, and the source of the copies
        self._probe = AcceptQueueProbe(self._listener)
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

    @property
    def enabled(self) -> bool:
        """False where the accept queue cannot be read: tick() then does nothing."""
        return self._probe.supported

    def queued(self) -> int:
        """Connections set up by the kernel and not accepted yet (0 where that cannot be read)."""
        return self._probe.read() or 0

    def tick(self, _lag: float = 0.0) -> None:
        queued = self._probe.read()
        if queued is None:
            return
        self.last_queued = queued
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
                copy = socket.socket(fileno=os.dup(self._listener.fileno()))
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
            (
                "laneway_accept_queue",
                "New connections the kernel holds that the server has not accepted yet (at the last 50 ms tick).",
                "gauge",
                {},
                self.last_queued,
            ),
            (
                "laneway_accept_surges_total",
                "Times the listening socket was watched through more descriptors "
                "because new connections queued up unaccepted.",
                "counter",
                {},
                self.surges,
            ),
        ]

    def _close_copies(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()

    def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        self._close_copies()
        self._listener.close()
