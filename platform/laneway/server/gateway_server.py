"""The gateway's server: the first exit signal drains the gateway before the server stops,
and a surge of new connections is accepted through more watchers of the listening socket."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable

import uvicorn

from laneway.runtime import Runtime
from laneway.server.surge_acceptors import SurgeAcceptors
from laneway.server.uvicorn_fence import FencedServer, ProtocolFactory

log = logging.getLogger("laneway.server")


class GatewayServer(FencedServer):
    """A server whose first SIGTERM/SIGINT drains the gateway (stop admitting, finish or cut
    what runs, flush usage) before it stops; a second signal falls through to uvicorn's own
    (forced) exit."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime, *, accept_fanout: int = 1) -> None:
        super().__init__(config)
        self._runtime = runtime
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accept_fanout = accept_fanout
        self._surge: SurgeAcceptors | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def on_starting(self) -> None:
        self._loop = asyncio.get_running_loop()

    def on_started(self, listening: list[socket.socket], protocol_factory: ProtocolFactory) -> None:
        if self._accept_fanout > 1 and len(listening) == 1 and listening[0].family in (socket.AF_INET, socket.AF_INET6):
            config = self.config
            self._surge = SurgeAcceptors(
                listening[0].fileno(),
                protocol_factory,
                extra=self._accept_fanout - 1,
                backlog=config.backlog,
                ssl=config.ssl,
            )
            # Checked on the runtime's loop-lag tick (it starts with the lifespan, done by now).
            self._unsubscribe = self._runtime.loop_lag.subscribe(self._surge.tick)
            self._runtime.metrics.watch(self._surge.readings)

    def on_stopping(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._surge is not None:
            self._surge.close()

    def on_exit_signal(self, sig: int) -> bool:
        if self._drain_task is not None or self._loop is None:
            return False  # a second signal, or one before the loop runs: uvicorn's own exit
        log.info("received %s: draining before shutdown", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._begin_drain)
        return True

    def _begin_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain_then_exit(), name="drain")

    async def _drain_then_exit(self) -> None:
        try:
            await self._runtime.drain()
        except Exception:
            log.exception("draining failed; shutting down anyway")
        finally:
            self.request_exit()
