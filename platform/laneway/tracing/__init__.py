"""OpenTelemetry traces of the API requests, exported over OTLP/HTTP. Off unless an endpoint is
configured (settings.otlp_traces_endpoint, from OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT).

Off, it costs nothing: the OpenTelemetry packages are not even imported, no middleware is
installed, and the request path pays one `is None` branch where a span would start or end
(Call.trace, and the request's ASGI scope has no TRACE_KEY). On, laneway.tracing.otel holds
the spans: see its docstring for what each request records.

This module is the light part everyone may import (api, core): the scope key and the
start-up check. The SDK lives in laneway.tracing.otel, imported only when tracing is on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from laneway.contracts.scope import TRACE_KEY as TRACE_KEY  # re-exported: api and tracing read it here

if TYPE_CHECKING:
    from laneway.settings import Settings
    from laneway.tracing.otel import Tracing


class TracingUnavailable(RuntimeError):
    """Tracing is configured but cannot run (the `otel` extra is not installed)."""


def problem(settings: Settings) -> str | None:
    """Why the configured tracing cannot start, in one line; None when it can (or is off)."""
    if settings.otlp_traces_endpoint is None:
        return None
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        return (
            f"an OTLP traces endpoint is set ({settings.otlp_traces_endpoint}) but the OpenTelemetry packages are "
            f"missing ({exc.name}): pip install 'laneway[otel]', or unset OTEL_EXPORTER_OTLP_ENDPOINT"
        )
    return None


def build(settings: Settings) -> Tracing | None:
    """The tracing service when an endpoint is configured, else None; TracingUnavailable when it
    is configured and the packages are missing (a start-up error, never a silent no-op)."""
    if settings.otlp_traces_endpoint is None:
        return None
    reason = problem(settings)
    if reason is not None:
        raise TracingUnavailable(reason)
    from laneway.tracing.otel import Tracing

    return Tracing(settings.otlp_traces_endpoint, service_name=settings.otel_service_name)
