"""`laneway tenant set --daily-budget/--monthly-budget` and `laneway key set --monthly-budget`
end to end against a fresh SQLite database: given in the currency, stored in micro-units,
'none' clears; a bad figure is one line and status 1."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support import EXE


def test_budget_flags(tmp_path: Path) -> None:
    env = {**os.environ, "LANEWAY_DATA_DIR": str(tmp_path)}

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120, check=check)

    cli("tenant", "create", "acme")
    said = cli("tenant", "set", "acme", "--daily-budget", "5", "--monthly-budget", "100.25").stdout
    assert said == "updated tenant acme: budget_per_day 5000000, budget_per_month 100250000\n"
    assert "budget_per_day unlimited" in cli("tenant", "set", "acme", "--daily-budget", "none").stdout
    cli("key", "issue", "acme")
    said = cli("key", "set", "1", "--monthly-budget", "0.5").stdout
    assert said.endswith(": budget_per_month 500000\n")
    bad = cli("tenant", "set", "acme", "--monthly-budget", "-1", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("laneway: budget_per_month") and "\n" == bad.stderr[-1]
    assert bad.stderr.count("\n") == 1
