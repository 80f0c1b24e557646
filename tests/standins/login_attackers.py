"""Login attackers for tests/integration/test_admin_login_throttle.py, in a process of their
own (so that their threads do not compete with the gateway for its GIL, as remote attackers
would not): N threads, each from its own loopback address (127.0.0.10+i), post wrong
passwords as fast as the gateway answers until stdin closes, then print the status counts
as JSON. Odd threads try "admin", even ones spray random usernames."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections import Counter

import httpx


def main() -> None:
    base, n = sys.argv[1], int(sys.argv[2])
    stop = threading.Event()
    statuses: Counter[int] = Counter()
    bad: list[str] = []
    lock = threading.Lock()

    def attack(i: int) -> None:
        transport = httpx.HTTPTransport(local_address=f"127.0.0.{10 + i}")
        with httpx.Client(base_url=base, transport=transport, timeout=30) as c:
            while not stop.is_set():
                user = "admin" if i % 2 else f"user-{uuid.uuid4().hex[:6]}"
                r = c.post("/admin/api/login", json={"username": user, "password": "wrong password!"})
                with lock:
                    statuses[r.status_code] += 1
                    if r.status_code == 429 and not (
                        r.headers.get("retry-after", "").isdigit() and r.json()["error"]["type"] == "rate_limit_error"
                    ):
                        bad.append(r.text)

    threads = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    print("started", flush=True)
    sys.stdin.read()  # until the test closes it
    stop.set()
    for t in threads:
        t.join(30)
    print(json.dumps({"statuses": statuses, "bad": bad[:3]}), flush=True)


if __name__ == "__main__":
    main()
