"""A surge of new connections against a real `laneway serve` (uvloop): while the process is
stopped (SIGSTOP), 40 clients connect and send a request, and the kernel queues them. Resumed,
the gateway reads that queue on its next tick and watches its listening socket through more
descriptors (server.SurgeAcceptors: libuv accepts one connection a loop turn per descriptor),
answers all 40, and goes back to one descriptor once the queue has stayed empty."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import httpx
from support import seed, serve, sim_model, stop_all, wait_for

CLIENTS = 40


def listening_descriptors(pid: int, port: int) -> int:
    """How many of the process's descriptors are its listening socket on `port`."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
            inode = fields[9]
    assert inode is not None, f"nothing listens on {port}"
    fd_dir = Path(f"/proc/{pid}/fd")
    links = []
    for fd in os.listdir(fd_dir):
        try:
            links.append(os.readlink(fd_dir / fd))
        except OSError:  # closed meanwhile
            pass
    return links.count(f"socket:[{inode}]")


def metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_surge_of_new_connections_is_accepted_through_more_descriptors_then_fewer_again(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'laneway.db'}"
    keys = asyncio.run(
        seed(url, models={"sim": sim_model("sim", max_concurrency=64)}, tenants={"acme": {"max_concurrency": 100}})
    )
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(tmp_path),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_SHED_LOOP_DELAY_S": "0",
    }
    proc, port = serve(env)
    body = json.dumps({"model": "sim", "prompt": "go", "max_tokens": 2}).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys['acme']}\r\n"
        f"Content-Type: application/json\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    clients: list[socket.socket] = []
    try:
        before = listening_descriptors(proc.pid, port)
        assert before == 2  # the server's, and the copy its accept queue is read through
        assert metric(port, "laneway_accept_surges_total") == 0
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            for _ in range(CLIENTS):  # set up by the kernel, queued: nobody accepts
                c = socket.create_connection(("127.0.0.1", port), timeout=30)
                c.sendall(request)
                clients.append(c)
            time.sleep(0.2)  # time passing is the point: past the gateway's 50 ms tick while it is stopped
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        for c in clients:
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert metric(port, "laneway_accept_surges_total") == 1
        assert metric(port, "laneway_accept_queue") == 0
        wait_for(
            lambda: listening_descriptors(proc.pid, port) == before,
            within=10,
            what="the extra descriptors closing after 2 s of an empty queue",
        )
    finally:
        for c in clients:
            c.close()
        stop_all(proc)
