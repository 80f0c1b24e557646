"""The ASGI wrapper that tells the load shedder how far behind the event loop runs."""

from __future__ import annotations

import time
from typing import Any

from laneway.contracts.scope import PREPARING, RECEIVED_AT
from laneway.core import load_shedding
from laneway.core.load_shedding import LoadShedder


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
