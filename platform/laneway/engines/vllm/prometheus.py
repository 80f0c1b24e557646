"""vLLM's /metrics, as the load poller reads them."""

from __future__ import annotations


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric over its label sets: {name: value} (enough for vLLM's gauges)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out
