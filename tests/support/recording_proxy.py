"""A TCP relay on loopback between laneway and an upstream HTTP/1.1 server (a real engine): it
records each request laneway sends (method, path, headers, JSON body) in the order they
arrive, and can hold chosen requests back from the upstream until the test releases them.

Holding a request keeps laneway's engine slot for it busy for as long as the test wants, on
any machine, however fast the engine: what a test of laneway's own queue needs to have
requests wait there. Bytes are relayed untouched both ways, so streams, keep-alive and a
closed connection (the engine aborts the request) behave as they do without the relay."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # the parsed JSON body, or None
    at: float = field(default_factory=time.monotonic)

    @property
    def request_id(self) -> str:
        return self.headers.get("x-request-id", "")


def _parse(buffer: bytes) -> tuple[Recorded, int] | None:
    """The first whole request in `buffer` and its size in bytes, or None while incomplete.
    (laneway's client sends every body with a Content-Length.)"""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buffer[:end].decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {name.strip().lower(): value.strip() for name, _, value in (ln.partition(":") for ln in lines[1:])}
    size = end + 4 + int(headers.get("content-length", "0"))
    if len(buffer) < size:
        return None
    raw = buffer[end + 4 : size]
    body = json.loads(raw) if raw and "json" in headers.get("content-type", "") else None
    return Recorded(method, path, headers, body), size


class RecordingProxy:
    """Serve on a free loopback port (base_url) and relay to `upstream` (http://host:port);
    requests for which `hold` is true wait until release() lets them through."""

    def __init__(self, upstream: str, *, hold: Callable[[Recorded], bool] = lambda _: False) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self._upstream = (host, int(port or 80))
        self._hold = hold
        self.records: list[Recorded] = []
        self._held: list[tuple[Recorded, asyncio.Event]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recording-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def sent(self, prefix: str) -> list[Recorded]:
        """What reached the relay (held or not) whose X-Request-Id starts with `prefix`."""
        return [r for r in list(self.records) if r.request_id.startswith(prefix)]

    def held(self) -> list[Recorded]:
        return [r for r, gate in list(self._held) if not gate.is_set()]

    def release(self, which: Callable[[Recorded], bool] = lambda _: True) -> None:
        """Let held requests `which` picks go on to the upstream (and hold no new ones of them)."""
        previous = self._hold
        self._hold = lambda r: previous(r) and not which(r)
        for recorded, gate in list(self._held):
            if which(recorded):
                self._loop.call_soon_threadsafe(gate.set)

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection(*self._upstream)
        back = asyncio.create_task(self._pipe(upstream_r, client_w))
        buffer = b""
        try:
            while chunk := await client_r.read(65536):
                buffer += chunk
                while (parsed := _parse(buffer)) is not None:
                    recorded, size = parsed
                    raw, buffer = buffer[:size], buffer[size:]
                    self.records.append(recorded)
                    if self._hold(recorded):
                        gate = asyncio.Event()
                        self._held.append((recorded, gate))
                        await gate.wait()
                    upstream_w.write(raw)
                    await upstream_w.drain()
        except (ConnectionError, OSError):
            pass
        finally:  # the client went away: so does the upstream connection (the engine aborts)
            upstream_w.close()
            back.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await back
            client_w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        writer.close()
