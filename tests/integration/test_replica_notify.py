"""Two gateway replicas on one PostgreSQL: an admin change on one reaches the other through
LISTEN/NOTIFY, long before its next poll."""

from __future__ import annotations

from pathlib import Path

import httpx
from laneway.app import create_app
from support import ServerThread, in_process_settings, wait_for

PASSWORD = "correct horse battery"


def test_an_admin_change_reaches_the_other_replica_by_notify(pg_database: str, tmp_path: Path) -> None:
    database = pg_database

    def replica(name: str) -> ServerThread:
        settings = in_process_settings(
            data_dir=tmp_path / name, database_url=database, admin_password=PASSWORD, policy_poll_interval_s=3600
        )
        return ServerThread(create_app(settings)).start(wait_ready=False)

    a = replica("a")
    b = replica("b")
    try:
        # Both listening before the change: a replica still starting would read the new lane
        # in its first load, and the test would prove nothing about NOTIFY.
        for r in (a, b):
            wait_for(
                lambda r=r: r.runtime.running and r.runtime.config_changes.connected,  # type: ignore[misc]
                within=30,
                what="the replica's LISTEN",
            )
        admin = httpx.Client(base_url=a.base_url + "/admin/api")
        csrf = admin.post("/login", json={"username": "admin", "password": PASSWORD}).json()["csrf_token"]
        r = admin.put("/lanes/notified", json={"position": 0, "max_concurrency": 3}, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200
        # Heard through NOTIFY (polling is an hour away); `received` counts an apply once it has
        # finished, a moment after the new lane is visible.
        wait_for(
            lambda: b.runtime.policies.current.lane("notified") is not None and b.runtime.config_changes.received >= 1,
            10,
            0.01,
            "replica b hearing of the change",
        )
    finally:
        a.stop()
        b.stop()
