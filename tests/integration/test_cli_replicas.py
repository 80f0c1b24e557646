"""`laneway model replica add/remove/list`: the CLI gives one alias several replicas through the
admin service, one at a time, and a running gateway (which polls once an hour here, so only the
CLI's NOTIFY can tell it) lists them in /health/ready and serves through each; a removed one
serves nothing more. Every change is one audit row with the replicas before and after."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
from support import EXE, Gateway, start_gateway, wait_for

TOKEN = "replica-metrics-token"
# One slot each and slow enough that requests sent together are in flight together: every
# replica with a free slot gets one.
SIM = {"max_concurrency": 1, "decode_ms_base": 25.0}


def sim(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "engine_kind": "sim",
        "quantization": "sim",
        "gpu_type": "sim",
        "max_model_len": 8192,
        "config": SIM,
    }


def cli(env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120, check=check)

    return run


def replicas_listed(gw: Gateway) -> dict[str, bool]:
    """The alias m's deployments as the gateway's /health/ready details list them: name -> warm."""
    details = httpx.get(gw.base_url + "/health/ready", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    return {d["name"]: d["warm"] for d in details["deployments"] if d["alias"] == "m"}


def served_by(gw: Gateway, n: int) -> set[str]:
    """The deployments that served n requests sent together (from their usage rows)."""
    before = {r.id for r in gw.usage_rows("acme")}

    async def together() -> None:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)

        async def one(i: int) -> None:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=8
            )

        await asyncio.gather(*(one(i) for i in range(n)))

    asyncio.run(together())
    rows = [r for r in gw.usage_rows("acme") if r.id not in before]
    assert len(rows) == n and all(r.status == 200 for r in rows)
    return {r.deployment for r in rows}


def audit_rows(database_url: str) -> list[tuple[str, str, str, str, list[str]]]:
    from laneway.db.models import AuditEntry
    from laneway.db.session import make_engine, make_sessionmaker
    from sqlalchemy import select

    async def read() -> list[Any]:
        engine = make_engine(database_url)
        try:
            async with make_sessionmaker(engine)() as s:
                return list((await s.execute(select(AuditEntry).order_by(AuditEntry.id))).scalars())
        finally:
            await engine.dispose()

    return [
        (e.actor, e.action, e.entity, e.entity_id, [d["name"] for d in (e.after or {})["deployments"]])
        for e in asyncio.run(read())
    ]


def test_the_cli_adds_and_removes_replicas_a_running_gateway_serves(pg_database: str, tmp_path: Path) -> None:
    seed_with = {"models": {"m": [sim("m-a")]}, "tenants": {"acme": {}}}
    gw = start_gateway(
        tmp_path / "gw",
        database_url=pg_database,
        policy_poll_interval_s=3600,
        metrics_token=TOKEN,
        usage_flush_interval_s=0.05,
        seed_with=seed_with,
    )
    run = cli({**os.environ, "LANEWAY_DATA_DIR": str(tmp_path / "cli"), "LANEWAY_DATABASE_URL": pg_database})
    try:
        wait_for(lambda: gw.server.runtime.config_changes.connected, what="the gateway's LISTEN")
        config = json.dumps(SIM)
        added = run("model", "replica", "add", "m", "m-b", "--engine", "sim", "--config", config)
        assert added.stdout.strip() == "model m has 2 replicas: m-a, m-b"
        added = run(
            "model", "replica", "add", "m", "m-c", "--engine", "sim", "--config", config, "--max-model-len", "4096"
        )
        assert added.stdout.strip() == "model m has 3 replicas: m-a, m-b, m-c"
        listed = run("model", "replica", "list", "m").stdout.splitlines()
        assert [line.split("\t")[:3] for line in listed] == [
            ["m-a", "sim", "max_model_len 8192"],
            ["m-b", "sim", "max_model_len 2048"],
            ["m-c", "sim", "max_model_len 4096"],
        ]

        wait_for(
            lambda: replicas_listed(gw) == {"m-a": True, "m-b": True, "m-c": True},
            within=20,
            what="the gateway serving the three replicas the CLI set",
        )
        assert served_by(gw, 6) == {"m-a", "m-b", "m-c"}

        assert run("model", "replica", "remove", "m", "m-b").stdout.strip() == "model m has 2 replicas: m-a, m-c"
        wait_for(lambda: set(replicas_listed(gw)) == {"m-a", "m-c"}, within=20, what="m-b gone from the gateway")
        assert served_by(gw, 6) == {"m-a", "m-c"}

        refusals = [
            (["add", "m", "m-c", "--engine", "sim"], "laneway: 'm-c' is already a replica of 'm'"),
            (["remove", "m", "m-b"], "laneway: 'm' has no replica 'm-b' (it has m-a, m-c)."),
            (["add", "m", "m-d", "--engine", "sim", "--config", "{nope"], "laneway: --config is not JSON"),
        ]
        for args, said in refusals:
            out = run("model", "replica", *args, check=False)
            assert out.returncode == 1 and out.stderr.startswith(said) and len(out.stderr.splitlines()) == 1, out
        run("model", "replica", "remove", "m", "m-a")
        last = run("model", "replica", "remove", "m", "m-c", check=False)
        assert last.returncode == 1 and last.stderr.startswith("laneway: 'm-c' is the last replica of 'm'")
    finally:
        gw.stop()

    actor = f"cli:{getpass.getuser()}"
    assert audit_rows(pg_database) == [
        (actor, "update", "model", "m", ["m-a", "m-b"]),
        (actor, "update", "model", "m", ["m-a", "m-b", "m-c"]),
        (actor, "update", "model", "m", ["m-a", "m-c"]),
        (actor, "update", "model", "m", ["m-c"]),
    ]
