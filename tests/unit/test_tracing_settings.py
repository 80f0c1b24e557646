"""Tracing is configured by the OpenTelemetry variables, as the SDK's specification reads them."""

from __future__ import annotations

import pytest
from laneway.settings import Settings
from laneway.tracing import build


@pytest.mark.parametrize(
    ("env", "endpoint"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
        # The signal's own variable is used as given, and wins over the general one.
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9/t"},
            "http://b:9/t",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, None),
        (
            {"LANEWAY_OTLP_TRACES_ENDPOINT": "http://l:1/v1/traces", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            "http://l:1/v1/traces",
        ),
    ],
)
def test_the_traces_endpoint_comes_from_the_otel_variables(env: dict[str, str], endpoint: str | None) -> None:
    assert Settings.from_env(env).otlp_traces_endpoint == endpoint


def test_the_service_name_is_laneway_unless_otel_service_name_says_otherwise() -> None:
    assert Settings.from_env({}).otel_service_name == "laneway"
    assert Settings.from_env({"OTEL_SERVICE_NAME": "gw-eu"}).otel_service_name == "gw-eu"


def test_off_builds_nothing() -> None:
    assert build(Settings()) is None
