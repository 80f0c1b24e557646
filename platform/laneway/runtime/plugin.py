"""RuntimePlugin: a Runtime's start and stop as the app's lifespan, its services as the app's
dependencies."""

from __future__ import annotations

from typing import Any

from litestar.config.app import AppConfig
from litestar.plugins import InitPluginProtocol

from laneway.runtime.services import Runtime


class RuntimePlugin(InitPluginProtocol):
    """Wires a Runtime into the app: its start and stop as the lifespan, its services as
    dependencies. `runtime_of(app)` finds it again (the server's drain, tests, benchmarks)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.lifespan = [self.runtime.lifespan, *app_config.lifespan]
        app_config.dependencies = {**self.runtime.dependencies(), **app_config.dependencies}
        return app_config


def runtime_of(app: Any) -> Runtime | None:
    """The Runtime of a laneway app; None for any other ASGI app (a test's stand-in engine)."""
    plugins = getattr(app, "plugins", None)
    if plugins is None:
        return None
    for plugin in plugins.init:
        if isinstance(plugin, RuntimePlugin):
            return plugin.runtime
    return None
