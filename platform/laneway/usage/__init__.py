"""The usage sink: every finished request leaves one usage row (recorder.py)."""

from laneway.usage.recorder import UsageRecorder

__all__ = ["UsageRecorder"]
