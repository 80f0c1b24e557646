"""The admin dashboard: this replica's readiness with its details (what /health/ready shows
only to the metrics token or an admin), queues now (the schedulers) and the last minutes of
its metrics, the panel refreshed by htmx; no database round trip, whatever the traffic."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.response import Template

from laneway.admin.dependencies import Queues, QueueStats, Registry
from laneway.admin.guards import AdminRequest, NotLoggedIn
from laneway.admin.live import LiveFigures
from laneway.admin.ui import Page, to_login
from laneway.engines.readiness import readiness_details
from laneway.engines.registry import EngineRegistry


def _span_words(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def panel_context(queue_stats: QueueStats, live: LiveFigures, registry: EngineRegistry) -> dict[str, Any]:
    """Readiness, queues now (the schedulers) and the last minutes of this replica's metrics:
    no database round trip, whatever the traffic."""
    queues = [
        {"lane": labels["lane"], "deployment": labels["deployment"], "waiting": w, "running": r}
        for labels, w, r in queue_stats()
    ]
    view = live.read()
    scale = max([t.ttft_ms[0.99] or 0.0 for t in view.lanes] + [1.0])
    return {
        "ready": registry.ready,
        "health": readiness_details(registry),
        "queues": queues,
        "view": view,
        "ttft": [t for t in view.lanes if t.ttft_n],
        "scale": scale,
        "span": _span_words(view.span_s),
    }


class DashboardPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    @get("/dashboard")
    async def dashboard(
        self, request: AdminRequest, queue_stats: Queues, live: NamedDependency[LiveFigures], registry: Registry
    ) -> Page:
        panel = panel_context(queue_stats, live, registry)
        context = {"admin": request.user.username, "csrf": request.user.csrf, **panel}
        return Template("dashboard.html", context=context)

    @get("/dashboard/panel")
    async def panel(self, queue_stats: Queues, live: NamedDependency[LiveFigures], registry: Registry) -> Page:
        return Template("dashboard_panel.html", context=panel_context(queue_stats, live, registry))
