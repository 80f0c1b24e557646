"""bench/streaming.py's client against a loopback server of a few lines: the reader of a
streaming request's answer returns with what came, whatever came. It once waited 600 s for a
first event on a keep-alive connection the gateway had answered with JSON (issue 37)."""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "streaming.py"
OVERLOADED = b'{"error": {"message": "The gateway is overloaded; retry shortly.", "code": "overloaded"}}'


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("streaming_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


Answering = Callable[[socket.socket], None]
Serve = Callable[[Answering], socket.socket]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Starts a one-connection server that reads the request and answers it with `answer`
    (then holds the connection open until the test ends); returns the client's socket, the
    request sent."""
    done = threading.Event()
    threads: list[threading.Thread] = []

    def start(answer: Answering) -> socket.socket:
        listener = socket.create_server(("127.0.0.1", 0))

        def run() -> None:
            conn, _ = listener.accept()
            with conn, listener:
                conn.recv(65536)
                answer(conn)
                done.wait(30)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        client = socket.create_connection(listener.getsockname())
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        return client

    yield start
    done.set()
    for thread in threads:
        thread.join(5)


def test_a_keep_alive_json_answer_is_returned_with_its_status_and_body(bench: ModuleType, serve: Serve) -> None:
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        b"content-length: " + str(len(OVERLOADED)).encode() + b"\r\n\r\n"
    )
    client = serve(lambda conn: conn.sendall(head + OVERLOADED))  # and the connection stays open
    started = time.monotonic()
    answer = bench.first_event(client, deadline_s=30)
    assert time.monotonic() - started < 5  # not the deadline: the whole answer was there
    assert answer == bench.Answer(False, 503, OVERLOADED, "answered")
    assert answer.line().startswith('503 answered: b\'{"error"')


def test_a_chunked_answer_split_over_writes_is_read_to_its_last_chunk(bench: ModuleType, serve: Serve) -> None:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 429 Too Many Requests\r\ntransfer-encoding: chunked\r\n\r\n5\r\nslow ")
        time.sleep(0.05)
        conn.sendall(b"\r\n4\r\ndown\r\n0\r\n\r\n")

    reply = bench.first_event(serve(answer), deadline_s=30)
    assert (reply.streamed, reply.status, reply.ended) == (False, 429, "answered") and b"down" in reply.body


def test_a_stream_is_read_to_its_first_event(bench: ModuleType, serve: Serve) -> None:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        time.sleep(0.05)
        conn.sendall(b'20\r\ndata: {"choices": [{"text": "a"}]}\n\n\r\n')

    assert bench.first_event(serve(answer), deadline_s=30) == bench.Answer(True, 200)


def test_silence_ends_at_the_deadline_and_a_close_at_once(bench: ModuleType, serve: Serve) -> None:
    started = time.monotonic()
    silent = bench.first_event(serve(lambda conn: None), deadline_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert silent == bench.Answer(False, None, b"", "timed out")

    def half_then_close(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 100\r\n\r\nshort")
        conn.shutdown(socket.SHUT_WR)

    closed = bench.first_event(serve(half_then_close), deadline_s=30)
    assert closed == bench.Answer(False, 502, b"short", "closed")
