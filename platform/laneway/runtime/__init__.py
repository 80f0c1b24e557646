"""The serving process's long-lived services (services.py: Runtime), started and stopped in
order (lifecycle.py), wired into the app (plugin.py), publishing their readings (readings.py)."""

from laneway.runtime.lifecycle import Lifecycle
from laneway.runtime.plugin import RuntimePlugin, runtime_of
from laneway.runtime.services import GC_YOUNG_OBJECTS, Runtime

__all__ = ["GC_YOUNG_OBJECTS", "Lifecycle", "Runtime", "RuntimePlugin", "runtime_of"]
