"""bench/batch.py at toy size, so that it cannot rot: a real `laneway serve` on the sim engine,
a few seconds of interactive streams, two small batches through the openai SDK, one probe.
What the bench's table relies on is checked, not its numbers' goals: every row is printed,
the streams and the probe were answered, the batch ran while it was measured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "batch.py"
TOY = ["--duration", "3", "--lines", "60", "--batch-window", "1", "--probes", "1", "--quiet", "0.5"]


def cells(out: str, row: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.startswith(f"| {row}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_batch_bench_runs_at_toy_size() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), *TOY], capture_output=True, text=True, timeout=240, env=os.environ.copy()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    alone, batch, both, probes = cells(out, "1 "), cells(out, "2 "), cells(out, "3 "), cells(out, "4 ")
    # interactive requests answered "(0)" failed, each with a TTFT, in rows 1 and 3
    for row in (alone, both):
        answered, failed = row[1].split()
        assert int(answered) > 0 and failed == "(0)", row
        assert row[2].endswith("ms") and row[3].endswith("ms"), row
    assert float(batch[7]) > 0 and float(batch[8]) > 0, batch  # lines/s and tokens/s while it ran alone
    assert float(both[7]) > 0, both
    assert probes[1] == "1 (0)" and probes[2].endswith("ms"), probes
    assert out.count("goal: ") == 3
    assert "batches ended as {'2': 'cancelled'" in out, out
