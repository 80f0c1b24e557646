"""Slow and hostile clients over real sockets: a reader taking one byte a second is cut (its
engine slot freed) once a send stays blocked; slowloris connections that never finish their
headers are closed by the request read timeout while normal clients are served; and the
connection cap answers 503 instead of running out of file descriptors."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from laneway.runtime import GC_YOUNG_OBJECTS
from laneway.server import CorkedTransport, GuardedHttpProtocol
from support import Gateway, closed_by_server, sim_model, start_gateway, wait_for


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = start_gateway(
        tmp_path_factory.mktemp("slow"),
        seed_with={
            "models": {"sim": sim_model("sim", max_concurrency=4, decode_ms_base=0.2, decode_ms_per_seq=0.0)},
            # No token bound that a slow reader would hit first: the send timeout must cut it.
            "lanes": [{"name": "standard", "max_concurrency": 4, "max_unacked_tokens": 10_000_000}],
            "tenants": {"acme": {}},
        },
        default_max_tokens=10_000_000,
        stream_send_timeout_s=1.0,
        http_request_read_timeout_s=1.0,
        usage_flush_interval_s=0.05,
        shed_loop_delay_s=0.02,  # the shedding test drives the shedder by hand
    )
    yield g
    g.stop()


def request_bytes(gw: Gateway, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.keys['acme']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def normal_request(gw: Gateway) -> int:
    r = httpx.post(
        gw.api_url + "/completions",
        headers={"Authorization": f"Bearer {gw.keys['acme']}"},
        json={"model": "sim", "prompt": "hi", "max_tokens": 3},
        timeout=10,
    )
    return r.status_code


def test_a_one_byte_a_second_reader_is_cut_and_its_slot_freed(gw: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    engine = gw.engine("sim")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    sock.sendall(request_bytes(gw, {"model": "sim", "prompt": "go", "max_tokens": 10_000_000, "stream": True}))
    try:
        wait_for(lambda: engine.active_slots == 1, what="the stream to start")
        stop = threading.Event()

        def trickle() -> None:  # the slow reader: one byte a second
            while not stop.is_set():
                try:
                    if not sock.recv(1):
                        return
                except OSError:
                    return
                stop.wait(1.0)

        reader = threading.Thread(target=trickle, daemon=True)
        reader.start()
        waited = wait_for(lambda: engine.active_slots == 0, within=20, what="the slow reader cut")
        stop.set()
    finally:
        sock.close()
    assert waited < 15
    row = next(r for r in reversed(gw.usage_rows("acme")) if r.stream)
    assert (row.status, row.error_code) == (499, "slow_client")
    assert normal_request(gw) == 200  # the slot went to someone who reads
    # The cut is on purpose: not logged as an application error (uvicorn's "returned without
    # completing response"), which would page an operator for every slow client.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_slowloris_connections_are_closed_while_normal_clients_are_served(gw: Gateway) -> None:
    loris = []
    for _ in range(300):  # each sends part of a request line, then a byte now and then
        s = socket.create_connection(("127.0.0.1", gw.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-a: ")
        loris.append(s)
    statuses = []
    started = time.monotonic()
    while time.monotonic() - started < 2.5:
        for s in loris[:50]:
            try:
                s.send(b"a")
            except OSError:
                pass
        statuses.append(normal_request(gw))
        time.sleep(0.05)
    assert set(statuses) == {200}
    assert closed_by_server(loris) == len(loris)


def test_beyond_the_connection_cap_clients_get_503_not_a_dead_server(tmp_path_factory: pytest.TempPathFactory) -> None:
    g = start_gateway(
        tmp_path_factory.mktemp("cap"),
        seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}}},
        http_max_connections=20,
        http_request_read_timeout_s=30,
    )
    held = [socket.create_connection(("127.0.0.1", g.port)) for _ in range(25)]
    try:
        for s in held:
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        wait_for(lambda: normal_request(g) == 503, within=5, what="503 beyond the cap")
    finally:
        for s in held:
            s.close()
    wait_for(lambda: normal_request(g) == 200, what="service once the connections are gone")
    g.stop()


def read_answers(sock: socket.socket, n: int) -> list[bytes]:
    """`n` whole responses with a Content-Length (heads may come in writes of their own, and
    several answers in one read); a connection closed first fails the test."""
    data, answers = b"", []
    while len(answers) < n:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            found = re.search(rb"(?i)content-length: (\d+)", data[:head_end])
            length = int(found.group(1)) if found else 0  # none: an interim answer (100 Continue)
            end = head_end + 4 + length
            if len(data) >= end:
                answers.append(data[:end])
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {len(answers)} of {n} answers"
        data += chunk
    assert not data, f"more than {n} answers: {data[:100]!r}"
    return answers


def read_answer(sock: socket.socket) -> bytes:
    return read_answers(sock, 1)[0]


@contextmanager
def held(monkeypatch: pytest.MonkeyPatch, target: Any, name: str) -> Iterator[threading.Event]:
    """Requests stop at `target.name` (an async method) until the event is set."""
    gate = threading.Event()
    original = getattr(target, name)

    async def waiting(*args: Any, **kwargs: Any) -> Any:
        await asyncio.to_thread(gate.wait, 30)
        return await original(*args, **kwargs)

    monkeypatch.setattr(target, name, waiting)
    try:
        yield gate
    finally:
        gate.set()


def test_requests_piling_up_before_the_queue_are_refused_at_the_door_but_running_streams_never_count(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog signal: while max_preparing API requests are between their whole body and
    an engine's queue (here: held in measuring), the next one gets the prepared 503 before any
    work, counted as `backlog`; a client still sending its body is no work yet and not counted;
    a request that reached the queue (a running stream) is no longer counted, so long
    generations never close the door."""
    shedder = gw.server.runtime.shedder
    cap = shedder.max_preparing
    body = json.dumps({"model": "sim", "prompt": "hi", "max_tokens": 2}).encode()
    request = request_bytes(gw, {"model": "sim", "prompt": "hi", "max_tokens": 2})
    head, payload = request[: -len(body)], request[-len(body) :]
    uploading = socket.create_connection(("127.0.0.1", gw.port))
    pending = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(2)]
    probe = socket.create_connection(("127.0.0.1", gw.port))
    shedder.max_preparing = 2
    try:
        uploading.sendall(head + payload[:5])  # the headers and a part of the body
        time.sleep(0.1)
        assert shedder.preparing == 0  # still sending: not the loop's work
        with held(monkeypatch, gw.engine("sim"), "measure") as gate:
            for s in pending:
                s.sendall(request)
            wait_for(lambda: shedder.preparing == 2, what="two requests being prepared")
            backlog_before = shedder.shed_by["backlog"]
            probe.sendall(request)
            answer = read_answer(probe)
            assert answer.startswith(b"HTTP/1.1 503") and b'"code": "overloaded"' in answer
            assert shedder.shed_by["backlog"] == backlog_before + 1
            pending[1].close()  # a client gone while its request is prepared leaves the count
            wait_for(lambda: shedder.preparing == 1, what="the closed connection to leave the count")
            gate.set()
            assert read_answer(pending[0]).startswith(b"HTTP/1.1 200")  # measured, queued, answered
        wait_for(lambda: shedder.preparing == 0, what="the answered requests to leave the count")
        uploading.sendall(payload[5:])  # the body's end: now it is work, and it is done at once
        assert read_answer(uploading).startswith(b"HTTP/1.1 200")
        probe.sendall(request)
        assert read_answer(probe).startswith(b"HTTP/1.1 200")  # room again: served
        with httpx.stream(
            "POST",
            gw.api_url + "/completions",
            headers={"Authorization": f"Bearer {gw.keys['acme']}"},
            json={"model": "sim", "prompt": "hi", "max_tokens": 100_000, "stream": True},
            timeout=10,
        ) as stream:
            chunks = stream.iter_bytes()
            next(chunks)  # streaming: it left the count when it queued for the engine
            assert shedder.preparing == 0
            shedder.max_preparing = 1
            probe.sendall(request)
            assert read_answer(probe).startswith(b"HTTP/1.1 200")  # the stream does not close the door
        metrics = httpx.get(gw.base_url + "/metrics").text
        assert f'laneway_shed_total{{reason="backlog"}} {float(shedder.shed_by["backlog"])}' in metrics
    finally:
        shedder.max_preparing = cap
        for s in (uploading, *pending, probe):
            s.close()


def test_a_backlog_that_stands_closes_the_door_lower_than_a_burst_does(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst over the low cap is let in (the hard cap is far); once arrivals have kept
    finding the low cap's worth of requests ahead of them for standing_s, the next one is
    refused `backlog`; after a gap in the pressure, the high cap again."""
    shedder = gw.server.runtime.shedder
    saved = shedder.standing_preparing, shedder.standing_s
    request = request_bytes(gw, {"model": "sim", "prompt": "hi", "max_tokens": 2})
    conns = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(6)]
    shedder.standing_preparing, shedder.standing_s = 2, 0.3
    try:
        with held(monkeypatch, gw.engine("sim"), "measure") as gate:
            for s in conns[:3]:  # a burst: the third finds two ahead, let in all the same
                s.sendall(request)
            wait_for(lambda: shedder.preparing == 3, what="the burst being prepared")
            backlog_before = shedder.shed_by["backlog"]
            time.sleep(0.2)
            conns[3].sendall(request)  # the pressure goes on, 0.2 s in: let in
            wait_for(lambda: shedder.preparing == 4, what="a fourth request being prepared")
            time.sleep(0.15)
            conns[4].sendall(request)  # 0.35 s of pressure with no gap of 0.3 s: it stands
            answer = read_answer(conns[4])
            assert answer.startswith(b"HTTP/1.1 503") and b'"code": "overloaded"' in answer
            assert shedder.shed_by["backlog"] == backlog_before + 1
            gate.set()
            for s in conns[:4]:
                assert read_answer(s).startswith(b"HTTP/1.1 200")
        wait_for(lambda: shedder.preparing == 0, what="the answered requests to leave the count")
        time.sleep(0.35)  # a gap in the pressure: a new episode
        with held(monkeypatch, gw.engine("sim"), "measure") as gate:
            for s in (*conns[:3], conns[5]):  # a burst again, of four: all let in
                s.sendall(request)
            wait_for(lambda: shedder.preparing == 4, what="the second burst being prepared")
            gate.set()
            for s in (*conns[:3], conns[5]):
                assert read_answer(s).startswith(b"HTTP/1.1 200")
        assert shedder.shed_by["backlog"] == backlog_before + 1
    finally:
        shedder.standing_preparing, shedder.standing_s = saved
        for s in conns:
            s.close()


def test_a_request_waiting_on_the_rate_limiter_is_not_counted_as_the_loops_work(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waits on Redis (the reserve) or the database (an API key's lookup) leave the backlog
    count: a slow dependency must not get requests refused `overloaded` by an idle loop."""
    shedder = gw.server.runtime.shedder
    cap = shedder.max_preparing
    gateway = gw.server.runtime.gateway
    request = request_bytes(gw, {"model": "sim", "prompt": "hi", "max_tokens": 2})
    waiting = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(4)]
    shedder.max_preparing = 1
    try:
        backlog_before = shedder.shed_by["backlog"]
        with held(monkeypatch, gateway, "_reserve") as gate:
            for n, s in enumerate(waiting, 1):  # each let in: the ones before wait at the limiter
                s.sendall(request)
                wait_for(lambda n=n: gateway.in_flight == n, what=f"{n} requests at the limiter")
                assert shedder.preparing == 0
            gate.set()
            for s in waiting:
                assert read_answer(s).startswith(b"HTTP/1.1 200")
        assert shedder.shed_by["backlog"] == backlog_before and shedder.preparing == 0
    finally:
        shedder.max_preparing = cap
        for s in waiting:
            s.close()


def test_an_overloaded_gateway_refuses_api_requests_before_any_work(gw: Gateway) -> None:
    """While the load shedder says the loop runs behind, /v1 requests get a prepared 503 from
    the protocol itself (no auth, no JSON), the connection stays usable, health still answers."""
    shedder = gw.server.runtime.shedder
    sock = socket.create_connection(("127.0.0.1", gw.port))
    try:
        body = json.dumps({"model": "sim", "prompt": "hi", "max_tokens": 2}).encode()
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        shedder.hold_s = 60.0
        for _ in range(shedder.min_arrivals):
            shedder.arrived()
        shedder.observe(1.0)  # as if the loop ran a second behind under load
        shed_before = shedder.shed
        sock.sendall(request)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer.lower()
        assert b'"code": "overloaded"' in answer and shedder.shed == shed_before + 1  # not a 401: no auth ran
        assert re.search(rb"\r\nx-request-id: req_[0-9a-f]{32}\r\n", answer)
        sock.sendall(request.replace(b"Host: x", b"Host: x\r\nX-Request-Id: shed-1"))
        assert b"\r\nx-request-id: shed-1\r\n" in sock.recv(65536)  # a client's own id, as everywhere
        assert httpx.get(gw.base_url + "/health/live").status_code == 200  # only the API is shed
        shedder._until = 0.0  # the loop caught up
        sock.sendall(request)  # the same connection, kept alive
        assert sock.recv(65536).startswith(b"HTTP/1.1 401")  # now the app answers (a wrong key)
    finally:
        shedder.hold_s = 0.05
        shedder._until = 0.0
        sock.close()


@contextmanager
def overloaded(gw: Gateway) -> Iterator[None]:
    """The load shedder saying the loop runs behind (for a minute, or until the block ends)."""
    shedder = gw.server.runtime.shedder
    shedder.hold_s = 60.0
    for _ in range(shedder.min_arrivals):
        shedder.arrived()
    shedder.observe(1.0)
    try:
        yield
    finally:
        shedder.hold_s = 0.05
        shedder._until = 0.0


def test_refusals_at_the_door_skip_the_parser_only_for_a_whole_plain_request(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole request in one read on an idle connection is refused without uvicorn's parser
    callbacks (server.GuardedHttpProtocol._refuse_whole); a body still to come, two requests
    in one read, a chunked body or `Expect` go through the parser and are refused the same
    way; every refusal leaves the connection usable, but for a client that asked to close."""
    begun: list[int] = []
    original = GuardedHttpProtocol.on_message_begin

    def counting(self: GuardedHttpProtocol) -> None:
        begun.append(1)
        original(self)

    monkeypatch.setattr(GuardedHttpProtocol, "on_message_begin", counting)
    shedder = gw.server.runtime.shedder
    whole = request_bytes(gw, {"model": "sim", "prompt": "hi", "max_tokens": 2})
    head, _, body = whole.partition(b"\r\n\r\n")
    chunked = head.replace(b"Content-Length: " + str(len(body)).encode(), b"Transfer-Encoding: chunked")
    chunked += b"\r\n\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    expecting = head + b"\r\nExpect: 100-continue\r\n\r\n" + body
    sock = socket.create_connection(("127.0.0.1", gw.port))
    try:
        with overloaded(gw):
            shed = shedder.shed
            sock.sendall(whole)
            assert read_answer(sock).startswith(b"HTTP/1.1 503")
            assert begun == [] and shedder.shed == shed + 1  # the parser never saw it
            sock.sendall(whole.replace(b"Host: x", b"Host: x\r\nx-REQUEST-id: door-1"))
            assert b"\r\nx-request-id: door-1\r\n" in read_answer(sock)  # found whatever its case
            sock.sendall(head + b"\r\n\r\n")  # the body in a second read
            time.sleep(0.05)
            sock.sendall(body)
            assert read_answer(sock).startswith(b"HTTP/1.1 503") and len(begun) == 1
            sock.sendall(whole + whole)  # two at once
            assert [a[:12] for a in read_answers(sock, 2)] == [b"HTTP/1.1 503"] * 2
            assert len(begun) == 3
            for odd in (chunked, expecting):
                sock.sendall(odd)
                answer = read_answer(sock)
                if answer.startswith(b"HTTP/1.1 100"):  # the interim answer, then the refusal
                    answer = read_answer(sock)
                assert answer.startswith(b"HTTP/1.1 503"), answer[:100]
            assert len(begun) == 5 and shedder.shed == shed + 7
        sock.sendall(whole)  # the loop caught up: the same connection, served
        assert read_answer(sock).startswith(b"HTTP/1.1 200")
        with overloaded(gw):
            sock.sendall(whole.replace(b"Host: x", b"Host: x\r\nConnection: close"))
            assert read_answer(sock).startswith(b"HTTP/1.1 503")
            assert closed_by_server([sock]) == 1
    finally:
        sock.close()


def test_a_connection_refused_at_the_door_stays_alive_from_its_last_refusal_then_closes(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refusals at the door re-arm no keep-alive timer each (a flood would pay a cancel and a
    new timer a refusal): the one timer, when it fires, counts the idle time from the last
    refusal. So a connection refused again and again stays open past the keep-alive time, and
    one left idle after a refusal is still closed."""
    monkeypatch.setattr(gw.server.server.config, "timeout_keep_alive", 0.6)  # new connections'
    whole = request_bytes(gw, {"model": "sim", "prompt": "hi", "max_tokens": 2})
    sock = socket.create_connection(("127.0.0.1", gw.port))
    try:
        with overloaded(gw):
            for _ in range(8):  # 1.6 s of refusals, 0.2 s apart: well past 0.6 s from the first
                sock.sendall(whole)
                assert read_answer(sock).startswith(b"HTTP/1.1 503")
                time.sleep(0.2)
        sock.settimeout(3.0)
        started = time.monotonic()
        assert sock.recv(4096) == b""  # closed by the server once idle for the keep-alive time
        assert time.monotonic() - started < 2.0
    finally:
        sock.close()


def test_a_started_gateway_freezes_its_startup_objects_and_collects_young_ones_by_the_ten_thousand(
    gw: Gateway,
) -> None:
    """The collector's pauses read as saturation to the load shedder, and at the default young
    generation (700 objects) a request's objects were scanned, promoted and scanned again: full
    collections of ~13 ms ran under load (bench/overhead.py, README). A started runtime sets a
    young generation of 10,000 and keeps what start-up made out of every scan."""
    assert gc.get_threshold()[0] == GC_YOUNG_OBJECTS == 10_000
    assert gc.get_freeze_count() > 0


def test_a_gateway_over_its_cpu_target_lets_in_only_its_admitted_share(gw: Gateway) -> None:
    """The cpu signal: with half of new API requests admitted, every other one gets the prepared
    503 at the door (counted as `cpu`) and the rest reach the app; /metrics shows the share."""
    shedder = gw.server.runtime.shedder
    sock = socket.create_connection(("127.0.0.1", gw.port))
    body = json.dumps({"model": "sim", "prompt": "hi", "max_tokens": 2}).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    target = shedder.cpu_target
    shedder.cpu_target = 0.0  # the monitor's ticks leave the share alone: this test sets it
    shedder.admit = 0.5
    try:
        cpu_before = shedder.shed_by["cpu"]
        statuses = []
        for _ in range(6):
            sock.sendall(request)  # one connection, kept alive through the refusals
            statuses.append(read_answer(sock).split(b" ", 2)[1])
        assert sorted(statuses) == [b"401"] * 3 + [b"503"] * 3, statuses  # a wrong key: the app ran
        assert shedder.shed_by["cpu"] == cpu_before + 3
        metrics = httpx.get(gw.base_url + "/metrics").text
        assert f'laneway_shed_total{{reason="cpu"}} {float(shedder.shed_by["cpu"])}' in metrics
        assert "laneway_api_admit_ratio 0.5" in metrics
    finally:
        shedder.admit, shedder.cpu_target = 1.0, target
        sock.close()


def test_an_idle_connection_outlives_the_sdks_own_keep_alive_expiry(gw: Gateway) -> None:
    """httpx (and so the OpenAI SDKs) drops an idle pooled connection after 5 s. Were the
    server to drop it at the same moment, a request sent on it just then would fail with a read
    error (seen under a flood); the server must keep it longer, so the client closes first."""
    with httpx.Client(
        base_url=gw.api_url,
        headers={"Authorization": f"Bearer {gw.keys['acme']}"},
        limits=httpx.Limits(keepalive_expiry=60),
        timeout=10,
    ) as c:
        peers = []
        for pause in (0.0, 5.5):
            time.sleep(pause)
            r = c.post(
                "/completions",
                json={"model": "sim", "prompt": "hi", "max_tokens": 3},
                extensions={
                    "trace": lambda name, info: (
                        peers.append(info.get("return_value")) if name == "connection.connect_tcp.complete" else None
                    )
                },
            )
            assert r.status_code == 200
        assert len(peers) == 1  # one TCP connection served both: the server kept it open


class _Recorder:
    """A connection's real transport, recording each system-call-sized write."""

    def __init__(self, transport: Any, writes: list[bytes]) -> None:
        self._transport, self._writes = transport, writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def writelines(self, pieces: list[bytes]) -> None:
        self._writes.append(b"".join(pieces))
        self._transport.writelines(pieces)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def test_a_whole_answer_leaves_in_one_write_and_order_holds(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn writes a response's head and body separately; the corked transport sends what a
    loop turn wrote in one go: a non-streaming answer is one write (one segment, one wake-up of
    the client), a stream still starts with its head at once, and pipelined answers keep
    their order."""
    writes: list[bytes] = []
    original = GuardedHttpProtocol.connection_made

    def recording(self: GuardedHttpProtocol, transport: Any) -> None:
        original(self, _Recorder(transport, writes))  # type: ignore[arg-type]

    monkeypatch.setattr(GuardedHttpProtocol, "connection_made", recording)
    whole = request_bytes(gw, {"model": "sim", "prompt": "hi", "max_tokens": 2})
    sock = socket.create_connection(("127.0.0.1", gw.port))
    try:
        sock.sendall(whole)
        answer = read_answer(sock)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"}")
        assert writes == [answer]  # head and body: one write
        writes.clear()
        sock.sendall(whole + whole)  # pipelined: two answers, in order, each whole
        answers = read_answers(sock, 2)
        assert [a[:12] for a in answers] == [b"HTTP/1.1 200"] * 2 and b"".join(writes) == b"".join(answers)
        writes.clear()
        sock.sendall(request_bytes(gw, {"model": "sim", "prompt": "hi", "max_tokens": 3, "stream": True}))
        deadline = time.monotonic() + 10
        received = b""
        while not received.endswith(b"0\r\n\r\n") and time.monotonic() < deadline:
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in received
        assert b"".join(writes) == received
    finally:
        sock.close()


def test_the_corked_transport_flushes_on_close_and_drops_on_abort() -> None:
    class Fake:
        def __init__(self) -> None:
            self.writes: list[bytes] = []
            self.closing = False
            self.aborted = False

        def write(self, data: bytes) -> None:
            self.writes.append(data)

        def writelines(self, pieces: list[bytes]) -> None:
            self.writes.append(b"".join(pieces))

        def is_closing(self) -> bool:
            return self.closing

        def close(self) -> None:
            self.closing = True

        def abort(self) -> None:
            self.closing = self.aborted = True

        def get_extra_info(self, name: str) -> str:
            return f"info:{name}"

        def get_write_buffer_size(self) -> int:
            return 0

    async def scenario() -> None:
        fake = Fake()
        corked = CorkedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
        corked.write(b"head ")
        corked.write(b"body")
        assert fake.writes == [] and corked.get_write_buffer_size() == 9
        await asyncio.sleep(0)  # the end of the turn
        assert fake.writes == [b"head body"]
        corked.write(b"last")
        corked.close()  # what was held goes first
        assert fake.writes == [b"head body", b"last"] and fake.closing
        corked.write(b"too late")
        await asyncio.sleep(0)
        assert fake.writes == [b"head body", b"last"]  # nothing to a closed connection
        big = b"x" * CorkedTransport.hold_bytes
        corked.transport = fake = Fake()
        corked.write(b"head")
        corked.write(big)  # past hold_bytes: out at once, for the transport's flow control to see
        assert fake.writes == [b"head" + big] and corked.get_write_buffer_size() == 0
        await asyncio.sleep(0)
        assert fake.writes == [b"head" + big]  # the end of the turn finds nothing more
        cut = Fake()
        corked = CorkedTransport(cut, asyncio.get_running_loop())  # type: ignore[arg-type]
        corked.write(b"partial")
        corked.abort()
        await asyncio.sleep(0)
        assert cut.writes == [] and cut.aborted
        assert corked.get_extra_info("peername") == "info:peername"

    asyncio.run(scenario())
