"""The usage rows a Gateway built in a unit test has queued, read off its UsageRecorder sink."""

from __future__ import annotations

from typing import Any

from laneway.core.pipeline import Gateway
from laneway.usage import UsageRecorder


def usage_rows(gateway: Gateway) -> list[dict[str, Any]]:
    recorder = next(s for s in gateway.sinks if isinstance(s, UsageRecorder))
    return recorder.queued_rows()
