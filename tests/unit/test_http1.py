"""The HTTP/1.1 client (engines/http1/), the vLLM adapter's, against a scripted server on loopback.

The server answers by path, so each test states what the upstream does (answer, stream in
steps, go silent, close at a chosen moment) and checks what the client did about it: the
connections it opened and reused, what the server saw (requests, disconnects), and the error
the caller got."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from laneway.engines.http1 import Http1Pool, UpstreamError, UpstreamTimeout
from support import until


@dataclass
class Upstream:
    port: int = 0
    connections: int = 0  # accepted so far
    open_now: int = 0
    most_open: int = 0
    requests: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)  # path, body, headers
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)  # a client left mid-answer
    release: asyncio.Event = field(default_factory=asyncio.Event)  # lets /step's second half go
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        self.writers.append(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((path, body, headers))
                if not await self.answer(path, body, reader, writer):
                    return
        finally:
            self.open_now -= 1
            writer.close()

    async def answer(self, path: str, body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False: close the connection."""
        if path == "/echo":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Seen: yes\r\n\r\n%s" % (len(body), body))
        elif path == "/close-after":  # answers, then closes (as a server's keep-alive timeout does)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            return False
        elif path == "/no-answer":  # reads the request and closes without a byte
            return False
        elif path == "/flaky":  # the first time as /no-answer, then an answer
            if sum(p == path for p, _, _ in self.requests) == 1:
                return False
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nanswered")
        elif path == "/silent":  # never answers; sees the client leave
            await reader.read(1)
            self.disconnected.set()
            return False
        elif path == "/until-close":  # HTTP/1.0 style: no length, the body ends with the connection
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
            await writer.drain()
            return False
        elif path == "/garbage":
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        elif path in ("/step", "/die-mid-body", "/big"):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            if path == "/die-mid-body":
                writer.transport.abort()
                return False
            if path == "/big":  # 8 MB the client does not read
                block = b"x" * 65536
                with contextlib.suppress(ConnectionError):
                    for _ in range(128):
                        writer.write(b"%x\r\n%s\r\n" % (len(block), block))
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                return True
            waiting = asyncio.ensure_future(self.release.wait())
            gone = asyncio.ensure_future(reader.read(1))  # b"" when the client closes
            done, _ = await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            for task in (waiting, gone):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # its read has stopped before the next request's
            if gone in done:
                self.disconnected.set()
                return False
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        return True

    def close_idle(self) -> None:
        for w in self.writers:
            w.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    try:
        yield up
    finally:
        server.close()
        up.close_idle()


@contextlib.asynccontextmanager
async def opened(base_url: str, **options: Any) -> AsyncIterator[Http1Pool]:
    pool = Http1Pool(base_url, **options)
    try:
        yield pool
    finally:
        await pool.close()


async def echo(pool: Http1Pool, body: bytes = b"hello") -> bytes:
    async with await pool.request("POST", "/echo", body, [("X-Request-Id", "r1")]) as r:
        assert r.status == 200
        return await r.read()


async def test_keep_alive_reuses_one_connection(upstream: Upstream) -> None:
    async with opened(upstream.url, headers=[("Authorization", "Bearer k")]) as pool:
        for i in range(5):
            assert await echo(pool, b"n%d" % i) == b"n%d" % i
        assert upstream.connections == 1 and pool.connections == 1 and pool.idle == 1
        path, body, headers = upstream.requests[-1]
        assert (path, body) == ("/echo", b"n4")
        assert headers["authorization"] == "Bearer k" and headers["x-request-id"] == "r1"
        assert headers["host"] == f"127.0.0.1:{upstream.port}" and headers["content-length"] == "2"


async def test_base_path_and_response_headers(upstream: Upstream) -> None:
    async with opened(upstream.url + "/") as pool:
        async with await pool.request("GET", "/echo") as r:
            assert r.headers["x-seen"] == "yes" and await r.read() == b""
        assert upstream.requests[-1][0] == "/echo"


async def test_a_stream_arrives_piece_by_piece(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        async with await pool.request("POST", "/step") as r:
            pieces = r.chunks()
            assert await anext(pieces) == b"first"  # before the server sends the rest
            upstream.release.set()
            assert [p async for p in pieces] == [b"second"]
        assert pool.idle == 1  # the whole body was read: the connection is kept
        assert await echo(pool) == b"hello" and upstream.connections == 1


async def test_closing_a_stream_early_closes_its_connection(upstream: Upstream) -> None:
    """The caller leaves mid-body (a client gone): the upstream sees the disconnect, the
    connection is never reused."""
    async with opened(upstream.url) as pool:
        r = await pool.request("POST", "/step")
        async with r:
            assert await anext(r.chunks()) == b"first"
        await asyncio.wait_for(upstream.disconnected.wait(), 5)
        assert pool.connections == 0
        assert await echo(pool) == b"hello" and upstream.connections == 2


async def test_a_request_cancelled_before_its_answer_closes_the_connection(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        task = asyncio.ensure_future(pool.request("POST", "/silent"))
        await until(lambda: upstream.requests, step=0.001, what="the request upstream")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.connections == 0 and pool.idle == 0
        await asyncio.wait_for(upstream.disconnected.wait(), 5)  # the server saw the connection go


async def test_a_connection_the_server_closed_while_idle_is_replaced(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        async with await pool.request("GET", "/close-after") as r:
            assert await r.read() == b"ok"
        assert await echo(pool) == b"hello"
        assert upstream.connections == 2 and [p for p, _, _ in upstream.requests] == ["/close-after", "/echo"]


async def test_a_reused_connection_closed_as_the_request_goes_out_is_retried_once(upstream: Upstream) -> None:
    """The race of a keep-alive timeout: the server closes a connection the pool still holds as
    idle just as a request is written on it; nothing of an answer came back, so the request
    is sent once more, on a fresh connection."""
    async with opened(upstream.url) as pool:
        await echo(pool)
        async with await pool.request("POST", "/flaky", b"once") as r:  # reused; closed unanswered
            assert await r.read() == b"answered"
        assert [(p, b) for p, b, _ in upstream.requests] == [
            ("/echo", b"hello"),
            ("/flaky", b"once"),
            ("/flaky", b"once"),
        ]
        assert upstream.connections == 2


async def test_a_fresh_connection_closed_without_an_answer_is_not_retried(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        with pytest.raises(UpstreamError, match="before answering"):
            await pool.request("POST", "/no-answer", b"x")
        assert [p for p, _, _ in upstream.requests] == ["/no-answer"]  # sent once
        assert pool.connections == 0


async def test_a_server_dying_mid_body_is_an_error(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        async with await pool.request("POST", "/die-mid-body") as r:
            pieces = r.chunks()
            assert await anext(pieces) == b"first"
            with pytest.raises(UpstreamError, match="mid-answer"):
                await anext(pieces)
        assert pool.connections == 0


async def test_a_body_delimited_by_the_close(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        async with await pool.request("GET", "/until-close") as r:
            assert await r.read() == b"all of it"
        assert pool.idle == 0


async def test_a_malformed_answer_is_an_error(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        with pytest.raises(UpstreamError, match="malformed"):
            await pool.request("GET", "/garbage")
        assert pool.connections == 0


async def test_connection_refused_and_connect_timeout() -> None:
    with contextlib.closing(__import__("socket").socket()) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        pool = Http1Pool(f"http://127.0.0.1:{port}")
        with pytest.raises(UpstreamError, match="cannot connect"):
            await pool.request("GET", "/health")
        assert pool.connections == 0
        await pool.close()


async def test_read_timeout(upstream: Upstream) -> None:
    async with opened(upstream.url, read_timeout_s=0.2) as pool:
        with pytest.raises(UpstreamTimeout, match="no data"):
            await pool.request("POST", "/silent")
        assert pool.connections == 0
        await asyncio.wait_for(upstream.disconnected.wait(), 5)


async def test_the_pool_never_opens_more_than_its_limit(upstream: Upstream) -> None:
    async with opened(upstream.url, limit=2) as pool:
        bodies = await asyncio.gather(*(echo(pool, b"%d" % i) for i in range(20)))
        assert bodies == [b"%d" % i for i in range(20)]
        assert upstream.most_open <= 2 and pool.connections <= 2


@pytest.mark.parametrize("woken", [False, True], ids=["cancelled while waiting", "cancelled once woken"])
async def test_a_waiter_cancelled_at_the_limit_passes_its_turn_on(upstream: Upstream, woken: bool) -> None:
    async with opened(upstream.url, limit=1) as pool:
        holder = await pool.request("POST", "/step")  # holds the only connection
        leaving = asyncio.ensure_future(echo(pool, b"leaving"))
        staying = asyncio.ensure_future(echo(pool, b"staying"))
        await asyncio.sleep(0.01)
        if not woken:
            leaving.cancel()
        upstream.release.set()
        await holder.read()
        holder.release()  # wakes the first waiter: `leaving`
        if woken:
            leaving.cancel()  # before it runs: its turn must go to `staying`
        assert await asyncio.wait_for(staying, 5) == b"staying"
        assert leaving.cancelled()


async def test_a_body_not_read_pauses_the_socket(upstream: Upstream) -> None:
    async with opened(upstream.url, high_water=64 * 1024) as pool:
        r = await pool.request("GET", "/big")
        await asyncio.sleep(0.3)  # time passing is the point: the server writes as fast as it can meanwhile
        assert r._buffered < 8 * 1024 * 1024 // 4  # bounded near high_water, not the whole 8 MB
        assert r.conn._paused
        total = sum([len(p) async for p in r.chunks()])
        assert total == 5 + 128 * 65536
        r.release()
        assert pool.idle == 1


async def test_headers_with_line_breaks_are_refused(upstream: Upstream) -> None:
    async with opened(upstream.url) as pool:
        with pytest.raises(ValueError, match="invalid header"):
            await pool.request("GET", "/echo", b"", [("X-Request-Id", "a\r\nX-Evil: 1")])
        assert upstream.requests == []


def test_only_http_and_https_upstreams() -> None:
    async def make() -> None:
        Http1Pool("ftp://example.invalid")

    with pytest.raises(ValueError, match="https://"):
        asyncio.run(make())


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate for the TLS test")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(d / "key.pem"),
            "-out",
            str(d / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return d / "cert.pem", d / "key.pem"


async def test_an_https_upstream(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    up = Upstream()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    trusting = Http1Pool(f"https://127.0.0.1:{port}", tls=ssl.create_default_context(cafile=str(cert)))
    stranger = Http1Pool(f"https://127.0.0.1:{port}")  # the system's trust store: not this CA
    try:
        for _ in range(2):
            assert await echo(trusting, b"secret") == b"secret"
        assert up.connections == 1  # kept alive over TLS too
        with pytest.raises(UpstreamError, match="cannot connect"):
            await stranger.request("GET", "/echo")
    finally:
        await trusting.close()
        await stranger.close()
        server.close()
        up.close_idle()
