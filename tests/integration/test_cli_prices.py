"""`laneway model price` end to end, in subprocesses, against a fresh SQLite database: set,
change one figure (the others stay), show, remove; a bad figure is one line and status 1."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support import EXE


def test_model_price(tmp_path: Path) -> None:
    env = {**os.environ, "LANEWAY_DATA_DIR": str(tmp_path), "LANEWAY_CURRENCY": "EUR"}

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120, check=check)

    cli("model", "set", "m", "--engine", "sim")
    assert cli("model", "price", "m").stdout == "model m has no price\n"
    said = cli("model", "price", "m", "--input", "0.15", "--output", "0.60").stdout
    assert said == "model m costs 0.15 in, 0.6 out, 0.15 cached in (EUR per 1M tokens)\n"
    said = cli("model", "price", "m", "--cached-input", "0.075").stdout
    assert said == "model m costs 0.15 in, 0.6 out, 0.075 cached in (EUR per 1M tokens)\n"
    bad = cli("model", "price", "m", "--output", "-2", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("laneway: output:") and bad.stdout == ""
    assert cli("model", "price", "m", "--input", "none", "--output", "none", "--cached-input", "none").stdout == (
        "model m has no price\n"
    )
