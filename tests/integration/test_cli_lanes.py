"""`laneway lane list|set` and the tenant's TTFT grant from the command line, in subprocesses
against a fresh SQLite database: the admin API's checks and words."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

from support import EXE


def test_lane_targets_and_the_tenant_grant_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "LANEWAY_DATA_DIR": str(tmp_path)}

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120, check=check)

    cli("import-policies")
    listed = cli("lane", "list").stdout
    assert "interactive\tpriority 0\tqueue timeout 2 s\tTTFT target 1000 ms\tTPOT target 100 ms/token" in listed
    assert "batch\tpriority 2\tqueue timeout 600 s\tTTFT target none\tTPOT target none" in listed
    assert "TPOT target 100 ms/token\tcap none (learned limit)" in listed  # the shipped lanes set no cap
    out = cli("lane", "set", "interactive", "--max-concurrency", "8").stdout
    assert out.strip() == "updated lane interactive: max_concurrency 8"  # an optional policy ceiling
    assert "cap 8" in cli("lane", "list").stdout
    assert cli("lane", "set", "interactive", "--max-concurrency", "none").stdout.strip() == (
        "updated lane interactive: max_concurrency none"
    )
    out = cli("lane", "set", "interactive", "--ttft-target-ms", "800", "--tpot-target-ms", "none").stdout
    assert out.strip() == "updated lane interactive: ttft_target_ms 800, tpot_target_ms none"
    for args, said in (
        (["--ttft-target-ms", "0"], "laneway: ttft_target_ms must be a whole number of milliseconds"),
        (["--ttft-target-ms", "5000"], "laneway: ttft_target_ms (5000 ms) must be at most the queue timeout"),
        (["--queue-timeout-s", "0.5"], "laneway: ttft_target_ms (800 ms) must be at most the queue timeout"),
    ):
        failed = cli("lane", "set", "interactive", *args, check=False)
        assert failed.returncode == 1 and failed.stderr.startswith(said), failed.stderr
    assert cli("lane", "set", "nowhere", "--ttft-target-ms", "5", check=False).stderr.strip() == (
        "laneway: no lane named 'nowhere'"
    )
    assert cli("lane", "set", "interactive", check=False).returncode == 2  # names nothing to change
    assert "created tenant ops" in cli("tenant", "create", "ops", "--min-ttft-target-ms", "250").stdout
    failed = cli("tenant", "set", "ops", "--min-ttft-target-ms", "-3", check=False)
    assert failed.returncode == 1 and failed.stderr.startswith("laneway: min_ttft_target_ms"), failed.stderr
    assert "min_ttft_target_ms none" in cli("tenant", "set", "ops", "--min-ttft-target-ms", "none").stdout
    with sqlite3.connect(tmp_path / "laneway.db") as db:
        row = db.execute(
            "SELECT ttft_target_ms, tpot_target_ms, queue_timeout_s, max_concurrency FROM lanes "
            "WHERE name = 'interactive'"
        )
        assert row.fetchone() == (800, None, 2.0, None)
