"""create_app(settings) -> Litestar: the routes, their guards and the runtime's services.

The /v1 endpoints that run the pipeline are the records of api/registry.py (one route each);
the long-lived services live in one `Runtime` (runtime/), started and stopped by the
lifespan; handlers get them as parameters through `Provide` (RuntimePlugin), and the admin
routers' guards check the session and CSRF token before any admin handler runs.
"""

from __future__ import annotations

from litestar import Litestar, Router
from litestar.logging.config import LoggingConfig
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from laneway.admin.account_api import AdminAccountsAPI
from laneway.admin.api import AdminAPI
from laneway.admin.audit_pages import AuditPages
from laneway.admin.batch_pages import BatchPages
from laneway.admin.dashboard_pages import DashboardPages
from laneway.admin.guards import SESSION_COOKIE, AdminGuards, csrf_form, csrf_header
from laneway.admin.headers import admin_security_headers
from laneway.admin.model_pages import ModelPages
from laneway.admin.openapi import security_schemes as admin_security_schemes
from laneway.admin.policy_pages import PolicyPages
from laneway.admin.replica_pages import ReplicaPages
from laneway.admin.role_api import RoleAPI
from laneway.admin.role_pages import RolePages
from laneway.admin.route_pages import RoutePages
from laneway.admin.tenant_pages import TenantPages
from laneway.admin.ui import AdminUI
from laneway.admin.usage_api import UsageAPI
from laneway.admin.usage_ui import UsagePages
from laneway.api import registry
from laneway.api.batches.batches import BatchesController
from laneway.api.batches.files import FilesController
from laneway.api.errors import ErrorHandlers
from laneway.api.handlers import ModelsController
from laneway.api.health import live, metrics, metrics_token_guard, ready
from laneway.api.openapi import add_wire_schemas, openapi_config
from laneway.api.request_ids import stamp_request_id
from laneway.portal.api import PortalAPI
from laneway.portal.guards import PortalGuards
from laneway.portal.operator_api import PortalOperatorAPI
from laneway.portal.pages import PortalPages
from laneway.resources import ADMIN_STATIC, ADMIN_TEMPLATES, package_dir
from laneway.runtime import Runtime, RuntimePlugin
from laneway.settings import Settings
from laneway.tracing import build as build_tracing

# The JSON admin API, by area (portal/operator_api.py: a tenant's portal users and key caps).
ADMIN_API = [AdminAPI, UsageAPI, RoleAPI, AdminAccountsAPI, PortalOperatorAPI]

# The admin web UI's pages, by area (admin/ui.py: the login).
ADMIN_PAGES = [
    AdminUI,
    TenantPages,
    PolicyPages,
    ModelPages,
    ReplicaPages,
    RolePages,
    RoutePages,
    BatchPages,
    DashboardPages,
    AuditPages,
    UsagePages,
]


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or Settings.from_env()
    # None when no OTLP endpoint is set: then no middleware, no SDK import, no span anywhere.
    tracing = build_tracing(settings)
    runtime = Runtime(settings, tracing=tracing)
    admin = AdminGuards(lambda: runtime.sessions)
    portal = PortalGuards(lambda: runtime.sessions)
    metrics_token = metrics_token_guard(settings)
    endpoints = registry.endpoints()  # chat, completions, embeddings, responses and any registered
    app = Litestar(
        route_handlers=[
            ModelsController,
            *(endpoint.route() for endpoint in endpoints),
            FilesController,
            BatchesController,
            # The admin session, then the CSRF token of a change: in a header for the JSON API,
            # in the form for the pages (which redirect to the login page without a session).
            # Then the role against the route's rule (admin/roles.py), after the CSRF check so
            # a forged request is refused before it can fill the audit log with denials.
            Router("/", route_handlers=ADMIN_API, guards=[admin.session, csrf_header, admin.role]),
            Router("/", route_handlers=ADMIN_PAGES, guards=[admin.session, csrf_form, admin.role]),
            Router("/", route_handlers=[PortalAPI], guards=[portal.session, csrf_header, portal.role]),
            Router("/", route_handlers=[PortalPages], guards=[portal.session, csrf_form, portal.role]),
            create_static_files_router(path="/admin/static", directories=[package_dir(ADMIN_STATIC)]),
            live,
            ready,
            Router("/", route_handlers=[metrics], guards=[metrics_token]),
        ],
        plugins=[RuntimePlugin(runtime)],
        template_config=TemplateConfig(directory=package_dir(ADMIN_TEMPLATES), engine=JinjaTemplateEngine),
        middleware=[tracing.middleware({e.path: e.span for e in endpoints})] if tracing is not None else [],
        # X-Request-Id on every response; security headers on every /admin and /portal response; /metrics
        # and /schema behind metrics_token.
        before_send=[stamp_request_id, admin_security_headers],
        openapi_config=openapi_config(
            guards=[metrics_token], security_schemes=admin_security_schemes(session_cookie=SESSION_COOKIE)
        ),
        # Litestar configures the root logger: at the gateway's level, not always INFO.
        logging_config=LoggingConfig(root={"level": settings.log_level.upper(), "handlers": ["queue_listener"]}),
        exception_handlers=ErrorHandlers(runtime.metrics).mapping(),
        debug=False,
    )
    add_wire_schemas(app)
    return app
