"""Batches survive their replicas: two `laneway serve` processes share PostgreSQL and one is
SIGKILLed mid-batch (its leases run out, the other runs its lines, no custom_id is answered
twice); a gateway stopped mid-batch hands its lines back and a new one on the same database
finishes the batch; SIGTERM stops claiming and the drain writes what ran."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import openai
from laneway.db.session import make_engine
from sqlalchemy import text
from support import seed, serve, sim_model, start_gateway, stop_all, wait_for
from support.batches import chat_line, file_lines, jsonl, run_batch, wait_ended

LINES = 40


def _lines() -> bytes:
    return jsonl(chat_line(f"c{i}", "slow", f"question {i}", max_tokens=4) for i in range(LINES))


def _query(url: str, sql: str, **params: Any) -> list[Any]:
    async def run() -> list[Any]:
        engine = make_engine(url)
        try:
            async with engine.connect() as conn:
                return list((await conn.execute(text(sql), params)).all())
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _check_exactly_once(c: openai.OpenAI, done: Any) -> None:
    assert done.status == "completed", done
    output = file_lines(c, done.output_file_id)  # asserts no custom_id twice
    assert sorted(output) == sorted(f"c{i}" for i in range(LINES)) and done.error_file_id is None
    assert done.request_counts.completed == LINES and done.request_counts.failed == 0


def test_a_replica_sigkilled_mid_batch_loses_nothing(tmp_path: Path, pg_database: str) -> None:
    models = {"slow": sim_model("slow", decode_ms_base=60.0, max_concurrency=2)}
    keys = asyncio.run(seed(pg_database, models=models, tenants={"acme": {}}))
    env = {
        **os.environ,
        "LANEWAY_DATABASE_URL": pg_database,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_BATCH_LEASE_S": "2",
        "LANEWAY_BATCH_POLL_INTERVAL_S": "0.1",
        "LANEWAY_USAGE_FLUSH_INTERVAL_S": "0.05",
    }
    victim, _ = serve({**env, "LANEWAY_DATA_DIR": str(tmp_path / "a")})
    survivor, port_b = serve({**env, "LANEWAY_DATA_DIR": str(tmp_path / "b")})
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port_b}/v1", api_key=keys["acme"], max_retries=0)
        batch = run_batch(c, _lines())

        def victim_holds_lines() -> bool:
            rows = _query(
                pg_database,
                "SELECT count(*) FROM batch_items WHERE state = 'running' AND lease_owner LIKE :owner",
                owner=f"%-{victim.pid}-%",
            )
            done = _query(pg_database, "SELECT count(*) FROM batch_items WHERE state = 'succeeded'")
            return rows[0][0] > 0 and done[0][0] >= 4

        wait_for(victim_holds_lines, within=30, step=0.05, what="the victim running lines")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        done = wait_ended(c, batch.id, within=90)
        _check_exactly_once(c, done)
        retried = _query(pg_database, "SELECT count(*) FROM batch_items WHERE attempts > 1")
        assert retried[0][0] > 0  # the victim's lines ran again, on the survivor
    finally:
        stop_all(victim, survivor)


def test_a_stopped_gateway_hands_its_lines_back_and_a_new_one_finishes_the_batch(tmp_path: Path) -> None:
    models = {"slow": sim_model("slow", decode_ms_base=40.0, max_concurrency=2)}
    seeded = {"models": models, "tenants": {"acme": {}}}
    first = start_gateway(tmp_path, seed_with=seeded, batch_poll_interval_s=0.1)
    url = first.database_url
    c = openai.OpenAI(base_url=first.api_url, api_key=first.keys["acme"], max_retries=0)
    batch = run_batch(c, _lines())
    wait_for(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 4, within=30, what="some lines done")
    first.stop()  # a graceful stop: running lines end or go back to pending
    held = _query(url, "SELECT count(*) FROM batch_items WHERE state = 'running'")
    assert held[0][0] == 0
    assert _query(url, "SELECT count(*) FROM batch_items WHERE state = 'pending'")[0][0] > 0
    second = start_gateway(tmp_path, database_url=url, batch_poll_interval_s=0.1)
    try:
        c = openai.OpenAI(base_url=second.api_url, api_key=first.keys["acme"], max_retries=0)
        _check_exactly_once(c, wait_ended(c, batch.id, within=60))
    finally:
        second.stop()


def test_sigterm_stops_claiming_and_the_drain_writes_what_ran(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'laneway.db'}"
    keys = asyncio.run(
        seed(url, models={"slow": sim_model("slow", decode_ms_base=40.0, max_concurrency=2)}, tenants={"acme": {}})
    )
    env = {
        **os.environ,
        "LANEWAY_DATA_DIR": str(tmp_path),
        "LANEWAY_DATABASE_URL": url,
        "LANEWAY_BOOTSTRAP_DEMO": "false",
        "LANEWAY_BATCH_POLL_INTERVAL_S": "0.1",
    }
    proc, port = serve(env)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=keys["acme"], max_retries=0)
        batch = run_batch(c, _lines())
        wait_for(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 2, within=30, what="lines done")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    states = dict(_query(url, "SELECT state, count(*) FROM batch_items GROUP BY state"))
    assert "running" not in states and states.get("succeeded", 0) >= 2 and states.get("pending", 0) > 0
    # Every line that succeeded has its one result; none was written twice (one row per line).
    assert sum(states.values()) == LINES
    usage = _query(url, "SELECT count(*) FROM usage_records WHERE status = 200 AND lane = 'batch'")
    assert usage[0][0] >= states["succeeded"]
