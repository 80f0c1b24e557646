"""PostgreSQL stopped under traffic (a private cluster of the test's own): keys in use keep
working from the cache, an unknown key gets 503 (not 500), the usage rows of the outage are
written once the database is back, and a revocation made then is seen within a second."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx
from support import PrivatePostgres, sim_model, start_gateway, until, wait_for


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_known_keys_ride_out_a_database_outage(private_pg: PrivatePostgres, tmp_path: Path) -> None:
    gw = await asyncio.to_thread(
        start_gateway,
        tmp_path,
        database_url=private_pg.url,
        seed_with={
            "models": {"sim": sim_model("sim", max_concurrency=16, decode_ms_base=0.5)},
            "tenants": {"acme": {}, "other": {}},
        },
        auth_cache_ttl_s=0.2,
        usage_flush_interval_s=0.05,
        database_connect_timeout_s=0.5,
        database_command_timeout_s=1.0,
        policy_poll_interval_s=0.2,  # the policy and engine pollers meet the outage too
    )
    keys = gw.keys
    errors = Collected()  # on the gateway's loggers (the app's logging config replaces the root's handlers)
    logging.getLogger("laneway").addHandler(errors)
    statuses: list[int] = []
    try:
        async with httpx.AsyncClient(base_url=gw.api_url, timeout=10) as c:

            async def call(key: str) -> httpx.Response:
                return await c.post(
                    "/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                )

            assert (await call(keys["acme"])).status_code == 200
            await asyncio.to_thread(private_pg.stop)
            started = time.monotonic()
            while time.monotonic() - started < 4:  # four seconds down, 16 requests at a time
                responses = await asyncio.gather(*(call(keys["acme"]) for _ in range(16)))
                statuses += [r.status_code for r in responses]
            unknown = await call(keys["other"])  # never used before the outage
            await asyncio.to_thread(private_pg.start)
            # An outage is counted and reported a line a minute, never a traceback per poll.
            assert not errors.records, [r.getMessage() for r in errors.records]
            assert gw.server.runtime.health.errors["database"] > 0
            assert set(statuses) == {200}, sorted(set(statuses))
            assert unknown.status_code == 503 and unknown.json()["error"]["code"] == "database_unavailable"
            assert "retry-after" in unknown.headers
            # Every request of the outage has its row once the database is back.
            recorder = gw.server.runtime.recorder
            await asyncio.to_thread(wait_for, lambda: recorder.pending == 0, 30, 0.01, "the usage backlog written")
            rows = await asyncio.to_thread(gw.usage_rows)
            assert len(rows) == gw.gateway.leases_opened == len(statuses) + 1
            # Revocation while the database is up again: refused within a second.
            await asyncio.to_thread(revoke_all_keys, gw.database_url)

            async def refused() -> bool:
                return (await call(keys["acme"])).status_code != 200

            await until(refused, within=1.0, step=0.02, what="the revoked key refused")
    finally:
        logging.getLogger("laneway").removeHandler(errors)
        await asyncio.to_thread(gw.stop)


def revoke_all_keys(url: str) -> None:
    from laneway.db.session import make_engine
    from sqlalchemy import text

    async def go() -> None:
        engine = make_engine(url)
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE api_keys SET revoked_at = now()"))
        await engine.dispose()

    asyncio.run(go())
