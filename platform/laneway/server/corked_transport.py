"""A connection's transport that sends what one loop turn wrote in one system call."""

from __future__ import annotations

import asyncio
from typing import Any


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
