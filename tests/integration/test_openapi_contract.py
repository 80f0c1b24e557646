"""The /v1 API against its own OpenAPI document: schemathesis generates requests from the
document (valid and invalid ones) and sends them, with a valid key, to a real gateway serving
the tiny llama.cpp model; every answer must be no server error, with a documented status and
content type, and a body that matches the documented schema. Plus the document itself."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from laneway import __version__
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig
from schemathesis.generation import GenerationMode
from support import Gateway, start_gateway

# Per operation, for valid and for invalid requests: about 10 s on 2 cores. A deeper run:
# LANEWAY_TEST_FUZZ_EXAMPLES=400 (about 40 s).
MAX_EXAMPLES = int(os.environ.get("LANEWAY_TEST_FUZZ_EXAMPLES", "25"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path) -> Iterator[Gateway]:
    config = {"model_path": str(demo_model_path), "parallel": 2, "demo": True}
    tiny = {
        "name": "tiny-llamacpp",
        "engine_kind": "llamacpp",
        "quantization": "f32",
        "gpu_type": "cpu",
        "max_model_len": 256,
        "config": config,
    }
    gw = start_gateway(
        tmp_path_factory.mktemp("contract"), seed_with={"models": {"tiny": [tiny]}, "tenants": {"acme": {}}}
    )
    yield gw
    gw.stop()


def test_the_v1_api_conforms_to_its_openapi_document(gw: Gateway) -> None:
    """schemathesis's strategies under plain hypothesis: its pytest plugin needs pytest
    internals that pytest 9 no longer has, and this gives one bounded, seeded run."""
    config = SchemathesisConfig.from_dict({"base-url": gw.base_url})
    schema = schemathesis.openapi.from_url(gw.base_url + "/schema/openapi.json", config=config)
    operations = [result.ok() for result in schema.include(path_regex="^/v1/").get_all_operations()]
    # models (2), chat, completions, embeddings, responses, messages (2), files (5), batches (4)
    assert len(operations) == 17
    auth = {"Authorization": f"Bearer {gw.keys['acme']}"}

    def call(case: Any) -> None:
        # Mostly the served model, so that generation runs (some unknown ones keep the 404 in
        # play), and streams half the time where the case leaves `stream` out.
        body = case.body
        if isinstance(body, dict) and isinstance(body.get("model"), str) and len(body["model"]) % 3:
            body["model"] = "tiny"
        if isinstance(body, dict) and "stream" not in body and len(body) % 2:
            body["stream"] = True
        if "model_id" in (case.path_parameters or {}) and len(str(case.path_parameters["model_id"])) % 2:
            case.path_parameters["model_id"] = "tiny"
        # A generous read timeout: a loaded 2-core machine (a parallel suite) answers a
        # generation slower than requests' default allows; conformance is the point, not speed.
        case.call_and_validate(headers=auth, checks=CHECKS, timeout=120)

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run = hypothesis.settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                derandomize=True,  # the same cases every run: a failure here is reproducible
                database=None,
                phases=[hypothesis.Phase.generate],  # no shrinking: each step would be a request
                suppress_health_check=list(hypothesis.HealthCheck),
            )(hypothesis.given(case=operation.as_strategy(generation_mode=mode))(call))
            run()


def test_the_document_describes_the_wire(gw: Gateway) -> None:
    doc = httpx.get(gw.base_url + "/schema/openapi.json").json()
    assert doc["info"]["title"] == "laneway" and doc["info"]["version"] == __version__
    assert httpx.get(gw.base_url + "/schema").json() == doc  # the same JSON: no HTML page (its CDN)
    assert httpx.get(gw.base_url + "/schema/swagger").status_code == 404
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert chat["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert chat["responses"]["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorEnvelope")
    assert chat["security"] == [{"apiKey": []}]
    schemas = doc["components"]["schemas"]
    temperature = schemas["ChatCompletionRequest"]["properties"]["temperature"]["anyOf"][0]
    assert temperature == {"type": "number", "minimum": 0.0, "maximum": 2.0}  # msgspec's own constraints
    assert set(schemas["ErrorBody"]["properties"]) == {"message", "type", "param", "code"}
    schemes = doc["components"]["securitySchemes"]
    assert schemes["apiKey"] == {"type": "http", "scheme": "bearer", "description": schemes["apiKey"]["description"]}
    assert schemes["adminSession"]["in"] == "cookie" and schemes["adminSession"]["name"] == "laneway_admin"
    assert schemes["csrfToken"]["in"] == "header" and schemes["csrfToken"]["name"] == "X-CSRF-Token"
    admin = doc["paths"]
    assert admin["/admin/api/tenants"]["get"]["security"] == [{"adminSession": []}]
    assert admin["/admin/api/tenants"]["post"]["security"] == [{"adminSession": [], "csrfToken": []}]
    assert "security" not in admin["/admin/api/login"]["post"]
    assert not any(path.startswith("/schema") for path in doc["paths"])
