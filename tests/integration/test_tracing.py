"""OpenTelemetry traces on the wire: a real gateway (the tiny llama.cpp model, the vLLM adapter
against its stand-in) exports over OTLP/HTTP to a receiver on loopback that decodes the
protobuf ExportTraceServiceRequest, as a collector does. Clients are the official openai SDK
and httpx (for the raw headers and a client that leaves)."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from standins.vllm_server import VLLMStandIn, vllm_config
from support import Gateway, free_port, sim_model, start_gateway, wait_for

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class WireSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start: int
    end: int
    attributes: dict[str, Any]
    status: int
    trace_state: str
    resource: dict[str, Any]


@dataclass
class OTLPReceiver:
    """POST /v1/traces: ExportTraceServiceRequest in protobuf (gzip or not), as a collector takes it."""

    spans: list[WireSpan] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def start(self) -> OTLPReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(request, self.headers.get("Content-Type", ""))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def add(self, request: ExportTraceServiceRequest, content_type: str) -> None:
        with self.lock:
            self.content_types.add(content_type)
            for rs in request.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            WireSpan(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_id=s.parent_span_id.hex(),
                                kind=s.kind,
                                start=s.start_time_unix_nano,
                                end=s.end_time_unix_nano,
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                status=s.status.code,
                                trace_state=s.trace_state,
                                resource=resource,
                            )
                        )

    def trace(self, trace_id: str) -> list[WireSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def root(self, **attributes: Any) -> WireSpan:
        """The request span whose attributes include `attributes`, once it has arrived."""

        def find() -> WireSpan | None:
            with self.lock:
                for s in self.spans:
                    server = s.kind == PbSpan.SPAN_KIND_SERVER
                    if server and all(s.attributes.get(k) == v for k, v in attributes.items()):
                        return s
            return None

        wait_for(lambda: find() is not None, within=10, step=0.01, what=f"a request span with {attributes}")
        found = find()
        assert found is not None
        return found

    def children(self, parent: WireSpan, names: set[str]) -> dict[str, WireSpan]:
        """`parent`'s child spans by name, once all of `names` have arrived."""

        def current() -> dict[str, WireSpan]:
            return {s.name: s for s in self.trace(parent.trace_id) if s.parent_id == parent.span_id}

        wait_for(lambda: names <= set(current()), within=10, step=0.01, what=f"child spans {names}")
        return current()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    r = OTLPReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path, receiver: OTLPReceiver, vllm: VLLMStandIn
) -> Iterator[Gateway]:
    llama = {"model_path": str(demo_model_path), "parallel": 2, "demo": True}
    tiny = [
        {
            "name": "tiny-llamacpp",
            "engine_kind": "llamacpp",
            "quantization": "f32",
            "gpu_type": "cpu",
            "max_model_len": 256,
            "config": llama,
        }
    ]
    remote = [
        {
            "name": "m-vllm",
            "engine_kind": "vllm",
            "quantization": "bf16",
            "gpu_type": "standin",
            "max_model_len": 4096,
            "config": vllm_config(vllm, metrics_poll_s=0),
        }
    ]
    embed = [
        {
            "name": "m-embed",
            "engine_kind": "vllm",
            "quantization": "bf16",
            "gpu_type": "standin",
            "config": vllm_config(vllm, metrics_poll_s=0, embeddings=True),
        }
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # export every 20 ms (the SDK reads it at start-up)
        g = start_gateway(
            tmp_path_factory.mktemp("tracing"),
            seed_with={
                "models": {"tiny": tiny, "m": remote, "m-embed": embed},
                "tenants": {"acme": {}, "limited": {"rpm": 1}},
            },
            otlp_traces_endpoint=receiver.url,
            otel_service_name="laneway-test",
        )
    yield g
    g.stop()


def client(gw: Gateway, key: str = "acme") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys[key], max_retries=0)


def within(child: WireSpan, parent: WireSpan) -> bool:
    return parent.start <= child.start <= child.end <= parent.end


def test_a_chat_completion_is_one_trace_of_its_stages(gw: Gateway, receiver: OTLPReceiver) -> None:
    answer = client(gw).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    root = receiver.root(**{"gen_ai.response.id": answer.id})
    assert root.name == "chat.completions" and root.parent_id == ""
    assert root.resource["service.name"] == "laneway-test"
    assert receiver.content_types == {"application/x-protobuf"}
    assert answer.usage is not None
    assert (
        root.attributes
        | {
            "laneway.model": "tiny",
            "laneway.deployment": "tiny-llamacpp",
            "laneway.engine": "llamacpp",
            "laneway.tenant": "acme",
            "laneway.stream": False,
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "tiny",
            "gen_ai.usage.input_tokens": answer.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": answer.usage.completion_tokens,
            "gen_ai.response.finish_reasons": [answer.choices[0].finish_reason],
            "http.response.status_code": 200,
        }
        == root.attributes
    )
    assert root.attributes["laneway.lane"] and "error.type" not in root.attributes
    assert root.status == PbStatus.STATUS_CODE_UNSET

    children = receiver.children(root, {"auth", "prepare", "queue", "chat tiny"})
    assert "stream" not in children  # not a streamed answer
    assert all(within(s, root) for s in children.values())
    assert children["auth"].end <= children["prepare"].start <= children["prepare"].end <= children["queue"].start
    engine = children["chat tiny"]
    assert engine.kind == PbSpan.SPAN_KIND_CLIENT and children["queue"].end <= engine.start
    assert engine.attributes["gen_ai.request.max_tokens"] == 8
    assert engine.attributes["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    steps = receiver.children(engine, {"first_token", "decode"})
    assert steps["first_token"].end == steps["decode"].start
    assert all(within(s, engine) for s in steps.values())


def test_a_request_with_a_traceparent_joins_the_callers_trace(gw: Gateway, receiver: OTLPReceiver) -> None:
    answer = client(gw).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "acme=t61rcWkgMzE"},
    )
    root = receiver.root(**{"gen_ai.response.id": answer.id})
    assert (root.trace_id, root.parent_id) == (CALLER_TRACE, CALLER_SPAN)
    assert root.trace_state == "acme=t61rcWkgMzE"
    assert {s.name for s in receiver.trace(CALLER_TRACE)} >= {"chat.completions", "auth", "queue", "chat tiny"}


def test_a_malformed_traceparent_starts_a_new_trace_and_the_request_runs(gw: Gateway, receiver: OTLPReceiver) -> None:
    r = httpx.post(
        gw.api_url + "/completions",
        headers={"Authorization": f"Bearer {gw.keys['acme']}", "traceparent": "00-zz-not-a-trace-01"},
        json={"model": "tiny", "prompt": "x", "max_tokens": 2},
    )
    assert r.status_code == 200
    root = receiver.root(**{"gen_ai.response.id": r.json()["id"]})
    assert root.name == "completions" and root.parent_id == "" and len(root.trace_id) == 32
    assert root.attributes["gen_ai.operation.name"] == "text_completion"


def test_a_streamed_answer_has_its_stream_span(gw: Gateway, receiver: OTLPReceiver) -> None:
    chunks = list(
        client(gw).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "stream"}], max_tokens=8, stream=True
        )
    )
    root = receiver.root(**{"gen_ai.response.id": chunks[0].id})
    assert root.attributes["laneway.stream"] is True and root.attributes["http.response.status_code"] == 200
    assert root.attributes["laneway.ttft_ms"] >= root.attributes["laneway.queue_ms"] >= 0
    children = receiver.children(root, {"auth", "queue", "chat tiny", "stream"})
    stream = children["stream"]
    assert within(stream, root) and stream.status == PbStatus.STATUS_CODE_UNSET
    assert stream.start <= children["chat tiny"].end  # the engine generates while the stream sends


def test_a_rate_limited_request_records_429_and_its_code(gw: Gateway, receiver: OTLPReceiver) -> None:
    limited = client(gw, "limited")
    limited.completions.create(model="tiny", prompt="one", max_tokens=2)
    with pytest.raises(openai.RateLimitError):
        limited.completions.create(model="tiny", prompt="two", max_tokens=2)
    root = receiver.root(**{"laneway.tenant": "limited", "http.response.status_code": 429})
    assert root.attributes["error.type"] == "rate_limit_exceeded"
    assert root.status == PbStatus.STATUS_CODE_UNSET  # the client's 4xx is not the server's error
    children = receiver.children(root, {"auth", "queue"})
    assert "chat tiny" not in children and "completions tiny" not in children  # never reached the engine
    queue = children["queue"]
    assert queue.status == PbStatus.STATUS_CODE_ERROR and queue.attributes["error.type"] == "rate_limit_exceeded"


def test_refusals_before_admission_are_traced_with_their_code(gw: Gateway, receiver: OTLPReceiver) -> None:
    bad_body = httpx.post(
        gw.api_url + "/chat/completions",
        headers={"Authorization": f"Bearer {gw.keys['acme']}", "traceparent": f"00-{'1' * 32}-{'2' * 16}-01"},
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"},
    )
    assert bad_body.status_code == 400
    root = wait_root_of_trace(receiver, "1" * 32)
    assert root.attributes["http.response.status_code"] == 400
    assert root.attributes["error.type"] == bad_body.json()["error"]["code"] == "invalid_request"
    assert root.attributes["laneway.tenant"] == "acme"
    assert "queue" not in {s.name for s in receiver.trace("1" * 32)}

    bad_key = httpx.post(
        gw.api_url + "/embeddings",
        headers={"Authorization": "Bearer sk-nope", "traceparent": f"00-{'3' * 32}-{'4' * 16}-01"},
        json={"model": "m-embed", "input": "x"},
    )
    assert bad_key.status_code == 401
    root = wait_root_of_trace(receiver, "3" * 32)
    assert root.name == "embeddings" and root.attributes["error.type"] == "invalid_api_key"
    auth = receiver.children(root, {"auth"})["auth"]
    assert auth.status == PbStatus.STATUS_CODE_ERROR and auth.attributes["error.type"] == "invalid_api_key"


def wait_root_of_trace(receiver: OTLPReceiver, trace_id: str) -> WireSpan:
    wait_for(
        lambda: any(s.kind == PbSpan.SPAN_KIND_SERVER for s in receiver.trace(trace_id)),
        within=10,
        step=0.01,
        what=f"the request span of trace {trace_id}",
    )
    return next(s for s in receiver.trace(trace_id) if s.kind == PbSpan.SPAN_KIND_SERVER)


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_receives_the_engine_spans_traceparent(
    gw: Gateway, receiver: OTLPReceiver, vllm: VLLMStandIn, stream: bool
) -> None:
    rid = f"trace-vllm-{stream}"
    headers = {
        "Authorization": f"Bearer {gw.keys['acme']}",
        "X-Request-Id": rid,
        "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
    }
    r = httpx.post(
        gw.api_url + "/chat/completions",
        headers=headers,
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream},
    )
    assert r.status_code == 200
    sent = next(q for q in vllm.requests if q["_request_id"].startswith(rid + ":"))
    version, trace_id, span_id, flags = sent["_traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CALLER_TRACE, "01")
    root = receiver.root(**{"laneway.request_id": rid})
    engine = receiver.children(root, {"chat m"})["chat m"]
    assert engine.span_id == span_id and engine.attributes["laneway.engine"] == "vllm"


def test_embeddings_are_traced_and_vllm_joins_the_trace(gw: Gateway, receiver: OTLPReceiver, vllm: VLLMStandIn) -> None:
    r = httpx.post(
        gw.api_url + "/embeddings",
        headers={"Authorization": f"Bearer {gw.keys['acme']}", "X-Request-Id": "trace-embed"},
        json={"model": "m-embed", "input": ["a b", "c"]},
    )
    assert r.status_code == 200
    root = receiver.root(**{"laneway.request_id": "trace-embed"})
    assert root.name == "embeddings" and root.attributes["gen_ai.operation.name"] == "embeddings"
    assert root.attributes["gen_ai.usage.input_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert "gen_ai.usage.output_tokens" not in root.attributes
    engine = receiver.children(root, {"embeddings m-embed"})["embeddings m-embed"]
    sent = next(q for q in vllm.requests if q["_request_id"].startswith("trace-embed:"))
    assert sent["_traceparent"].split("-")[1:3] == [root.trace_id, engine.span_id]


def test_a_client_that_leaves_mid_stream_is_recorded_once_as_499(
    gw: Gateway, receiver: OTLPReceiver, vllm: VLLMStandIn
) -> None:
    headers = {"Authorization": f"Bearer {gw.keys['acme']}", "X-Request-Id": "trace-gone"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", gw.api_url + "/chat/completions", headers=headers, json=body) as r:
        next(r.iter_bytes())  # the stream has begun; leave
    root = receiver.root(**{"laneway.request_id": "trace-gone"})
    assert root.attributes["http.response.status_code"] == 499
    assert root.attributes["error.type"] == "client_disconnected"
    children = receiver.children(root, {"stream", "chat m"})
    assert children["stream"].attributes["error.type"] == "client_disconnected"
    assert children["chat m"].status == PbStatus.STATUS_CODE_ERROR
    assert len([s for s in receiver.trace(root.trace_id) if s.kind == PbSpan.SPAN_KIND_SERVER]) == 1


def test_a_collector_that_is_down_costs_the_requests_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # export (and fail) while the requests run
    g = start_gateway(
        tmp_path, seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}}}, otlp_traces_endpoint=dead
    )
    try:
        sdk = client(g)
        for _ in range(20):
            started = time.perf_counter()
            assert sdk.completions.create(model="sim", prompt="x", max_tokens=2).choices[0].text is not None
            assert time.perf_counter() - started < 1.0  # the exporter's retries run in its own thread
    finally:
        started = time.perf_counter()
        g.stop()
        assert time.perf_counter() - started < 3.0 + 2.0  # Tracing.stop gives up on the collector after 3 s


def test_tracing_off_builds_no_exporter_and_records_nothing(tmp_path: Path, receiver: OTLPReceiver) -> None:
    g = start_gateway(tmp_path, seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}}})
    try:
        before = len(receiver.spans)
        r = httpx.post(
            g.api_url + "/completions",
            headers={"Authorization": f"Bearer {g.keys['acme']}", "traceparent": f"00-{'5' * 32}-{'6' * 16}-01"},
            json={"model": "sim", "prompt": "x", "max_tokens": 2},
        )
        assert r.status_code == 200
        assert g.server.runtime.tracing is None and not g.server.app.middleware
        assert g.gateway.in_flight == 0
        assert receiver.trace("5" * 32) == [] and len(receiver.spans) == before
    finally:
        g.stop()


GUARD = """
import sys
class NoOtel:  # as if the `otel` extra were not installed
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoOtel())
"""


def test_without_the_packages_tracing_off_runs_and_tracing_on_fails_in_one_line(tmp_path: Path) -> None:
    script = (
        GUARD
        + f"""
from laneway.app import create_app
from laneway.settings import Settings
from laneway.tracing import TracingUnavailable
create_app(Settings(data_dir={str(tmp_path)!r}))
assert not [m for m in sys.modules if m.startswith("opentelemetry")]
try:
    create_app(Settings(data_dir={str(tmp_path)!r}, otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces"))
except TracingUnavailable as exc:
    print(exc)
"""
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "\n" not in line and "pip install 'laneway[otel]'" in line and "4318" in line

    cli = GUARD + "from laneway.cli import main\nsys.argv = ['laneway', 'serve']\nmain()\n"
    env = {
        "PATH": "/usr/bin:/bin",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "LANEWAY_DATA_DIR": str(tmp_path),
        "PYTHONPATH": ":".join(sys.path),
    }
    served = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, timeout=60, env=env)
    assert served.returncode == 1
    assert served.stderr.strip().splitlines() == [
        "laneway: an OTLP traces endpoint is set (http://127.0.0.1:4318/v1/traces) but the OpenTelemetry "
        "packages are missing (opentelemetry): pip install 'laneway[otel]', or unset OTEL_EXPORTER_OTLP_ENDPOINT"
    ]
