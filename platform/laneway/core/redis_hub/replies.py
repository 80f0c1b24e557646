"""The hub's connection: calls written in order, each reply (parsed by hiredis as bytes arrive)
answering the oldest call waiting, and one timer that drops a Redis silent for `timeout_s`
while calls wait, with them. Error replies become redis-py's public exception classes, so
callers catch `redis.exceptions.RedisError` whichever client answered."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import hiredis
from redis import exceptions as rx

from laneway.core.redis_hub.script import LuaScript

# (script or None for a plain command, KEYS, ARGV or the command's words, the caller's future)
Call = tuple[LuaScript | None, list[str], list[Any], asyncio.Future[Any]]

# What redis-py raises for an error reply's leading word (the rest is the message).
_BY_CODE: dict[str, type[rx.RedisError]] = {
    "NOSCRIPT": rx.NoScriptError,
    "LOADING": rx.BusyLoadingError,
    "READONLY": rx.ReadOnlyError,
    "OOM": rx.OutOfMemoryError,
    "NOAUTH": rx.AuthenticationError,
    "WRONGPASS": rx.AuthenticationError,
    "NOPERM": rx.NoPermissionError,
    "EXECABORT": rx.ExecAbortError,
}


def reply_error(message: str) -> rx.RedisError:
    code, _, rest = message.partition(" ")
    kind = _BY_CODE.get(code)
    if kind is not None:
        return kind(rest)
    if code == "ERR":
        if rest == "max number of clients reached":
            return rx.ConnectionError(rest)
        if rest == "invalid password":
            return rx.AuthenticationError(rest)
        return rx.ResponseError(rest)
    return rx.ResponseError(message)


def pack(call: Call) -> bytes:
    script, keys, args, _ = call
    if script is None:
        return bytes(hiredis.pack_command(tuple(args)))
    return bytes(hiredis.pack_command(("EVALSHA", script.sha, len(keys), *keys, *args)))


class ReplyHandler(Protocol):
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def answer(self, call: Call, reply: Any) -> None: ...

    def lost(self, unanswered: list[Call], exc: BaseException, fresh: bool) -> None: ...


class Connection(asyncio.Protocol):
    """One connection to Redis; see the module's docstring."""

    def __init__(self, handler: ReplyHandler, timeout_s: float) -> None:
        self._handler = handler
        self._timeout = timeout_s
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader()
        self._timer: asyncio.TimerHandle | None = None
        # (call, deadline, replies read before it was sent), in the order sent
        self.waiting: deque[tuple[Call, float, int]] = deque()
        self.answered = 0
        self.lost = False
        self.loaded: set[str] = set()  # the scripts loaded on this connection (RedisHub._loads)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def send(self, data: bytes, batch: list[Call]) -> None:
        loop = self._handler.loop()
        deadline = loop.time() + self._timeout
        self.waiting.extend((call, deadline, self.answered) for call in batch)
        assert self._transport is not None
        self._transport.write(data)
        if self._timer is None:  # one timer a connection, moved along (not one per batch)
            self._timer = loop.call_at(deadline, self._check)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        answer: Callable[[Call, Any], None] = self._handler.answer
        try:
            while (reply := self._reader.gets()) is not False:
                if not self.waiting:
                    raise hiredis.ProtocolError(f"a reply nothing asked for: {reply!r}")
                call = self.waiting.popleft()[0]
                self.answered += 1
                answer(call, reply)
        except hiredis.ProtocolError as exc:
            self.drop(rx.ConnectionError(f"Redis protocol error: {exc}"))

    def _check(self) -> None:
        self._timer = None
        if not self.waiting:
            return
        deadline = self.waiting[0][1]
        loop = self._handler.loop()
        if loop.time() >= deadline:
            self.drop(rx.TimeoutError(f"Redis did not answer within {self._timeout:g} s"))
        else:
            self._timer = loop.call_at(deadline, self._check)

    def eof_received(self) -> bool:
        return False  # Redis closed its side: close ours (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.drop(rx.ConnectionError(f"Redis connection lost: {exc or 'closed by the server'}"))

    def drop(self, exc: BaseException) -> None:
        if self.lost:
            return
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.close()
        # Nothing answered since the oldest unanswered call was sent: the connection was gone
        # before it (stale), not lost in the middle of answering.
        fresh = bool(self.waiting) and self.waiting[0][2] == self.answered
        unanswered = [entry[0] for entry in self.waiting]
        self.waiting.clear()
        self._handler.lost(unanswered, exc, fresh)

    def close(self) -> None:
        self.drop(rx.ConnectionError("closed"))
