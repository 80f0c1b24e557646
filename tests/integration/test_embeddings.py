"""POST /v1/embeddings with the official OpenAI SDK against a real gateway: the tiny llama.cpp
model in embedding mode, a slow sim embedder (cancellation), and the vLLM adapter against
its stand-in. Through the same pipeline as completions: capability check, rate limits,
lanes by task, one usage row per request, the lease released when the client leaves."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from laneway.engines.base import EngineError
from laneway.engines.demo_model import DemoModelShape
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.engines.vllm import VLLMEngine
from laneway.types import EmbeddingRequest, GenerationRequest
from standins.vllm_server import VLLMStandIn
from support import Gateway, row_of, sim_model, start_gateway, until, wait_for

TEXTS = ["hello world", "the model", "hello world", "what is the time"]
LANES: list[dict[str, Any]] = [
    {"name": "embed", "priority": 1, "match_tasks": ["embeddings"]},
    {"name": "standard", "priority": 1},
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path, vllm: VLLMStandIn) -> Iterator[Gateway]:
    def llama(name: str, **config: Any) -> list[dict[str, Any]]:
        config = {"model_path": str(demo_model_path), "parallel": 1, **config}
        return [
            {
                "name": name,
                "engine_kind": "llamacpp",
                "quantization": "f32",
                "gpu_type": "cpu",
                "max_model_len": 256,
                "config": config,
            }
        ]

    base_url = vllm.base_url  # type: ignore[attr-defined]
    embedder = {"base_url": base_url, "model": "m", "embeddings": True, "metrics_poll_s": 0}
    vllm_embed = [
        {"name": "vllm-embed", "engine_kind": "vllm", "quantization": "bf16", "gpu_type": "standin", "config": embedder}
    ]
    g = start_gateway(
        tmp_path_factory.mktemp("embeddings"),
        seed_with={
            "models": {
                "tiny": llama("tiny-chat", demo=True),
                "tiny-embed": llama("tiny-embed", embedding=True),
                "slow-embed": sim_model("slow-embed", embeddings=True, embed_ms=120_000),
                "vllm-embed": vllm_embed,
            },
            "lanes": LANES,
            "tenants": {"acme": {}, "small": {"tpm": 40}, "simonly": {"allowed_models": ["tiny"]}},
        },
        usage_flush_interval_s=0.05,
    )
    yield g
    g.stop()


@pytest.fixture
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)


# ---- llama.cpp in embedding mode -------------------------------------------------------------


def test_float_and_base64_give_the_same_unit_vectors_of_the_models_width(gw: Gateway, client: openai.OpenAI) -> None:
    as_float = client.embeddings.create(model="tiny-embed", input=TEXTS, encoding_format="float")
    as_base64 = client.embeddings.create(model="tiny-embed", input=TEXTS)  # the SDK asks for base64 and decodes it
    assert as_float.object == "list" and as_float.model == "tiny-embed"
    assert [d.embedding for d in as_base64.data] == [d.embedding for d in as_float.data]
    width = gw.gateway.registry.resolve("tiny-embed", embeddings=True).engine.n_embd
    assert width == DemoModelShape().embd
    for d in as_float.data:
        assert d.object == "embedding" and len(d.embedding) == width
        assert abs(float(np.linalg.norm(d.embedding)) - 1.0) < 1e-5  # unit length, as OpenAI's
    # On the wire: base64 of little-endian float32, and floats when the client asks for nothing.
    h = {"Authorization": f"Bearer {gw.keys['acme']}"}
    raw = httpx.post(
        gw.api_url + "/embeddings",
        json={"model": "tiny-embed", "input": "hello world", "encoding_format": "base64"},
        headers=h,
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4").tolist()
    plain = httpx.post(gw.api_url + "/embeddings", json={"model": "tiny-embed", "input": "hello world"}, headers=h)
    body = plain.json()
    assert list(body) == ["object", "data", "model", "usage"] and body["object"] == "list"
    assert body["data"][0] == {"object": "embedding", "index": 0, "embedding": decoded}
    assert decoded == as_float.data[0].embedding


def test_list_inputs_keep_their_order_and_identical_inputs_embed_identically(client: openai.OpenAI) -> None:
    batch = client.embeddings.create(model="tiny-embed", input=TEXTS, encoding_format="float")
    assert [d.index for d in batch.data] == list(range(len(TEXTS)))
    vectors = [d.embedding for d in batch.data]
    assert vectors[0] == vectors[2]  # the same text
    assert len({tuple(v) for v in vectors}) == 3
    for text, vector in zip(TEXTS, vectors, strict=True):  # each as it is alone: batching changes nothing
        alone = client.embeddings.create(model="tiny-embed", input=text, encoding_format="float")
        assert np.allclose(alone.data[0].embedding, vector, atol=1e-6)


def test_one_usage_row_per_request_with_the_input_tokens(gw: Gateway, client: openai.OpenAI) -> None:
    raw = client.embeddings.with_raw_response.create(model="tiny-embed", input=TEXTS, user="u-7")
    r = raw.parse()
    engine = gw.gateway.registry.resolve("tiny-embed", embeddings=True).engine
    tokens = sum(len(engine._contexts[0].tokenize(t.encode(), add_bos=True)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == tokens
    assert raw.headers["x-laneway-lane"] == "embed"  # lane rules route by task "embeddings"
    row = row_of(gw, raw.headers["x-request-id"])
    assert (row.endpoint, row.model, row.deployment, row.status, row.stream) == (
        "embeddings",
        "tiny-embed",
        "tiny-embed",
        200,
        False,
    )
    assert (row.prompt_tokens, row.completion_tokens, row.end_user, row.lane) == (tokens, 0, "u-7", "embed")
    assert row.queue_ms is not None and row.total_ms is not None
    assert gw.gateway.in_flight == 0 and engine.active_slots == 0


def test_a_model_that_only_generates_refuses_embeddings_and_an_embedder_refuses_chat(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="tiny", input="hello")
    body: Any = info.value.body
    assert (body["code"], body["param"]) == ("unsupported_parameter", "model")
    assert "'tiny' does not serve embeddings" in body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "hi"}])
    body = info.value.body
    assert (body["code"], body["param"]) == ("unsupported_parameter", "model")
    assert "'tiny-embed' serves embeddings only" in body["message"]
    # The chat model still chats.
    assert client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_auth_and_the_allow_list_apply(gw: Gateway) -> None:
    other = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["simonly"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        other.embeddings.create(model="tiny-embed", input="hello")
    assert denied.value.body["code"] == "model_not_allowed"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.api_url, api_key="lw-wrong", max_retries=0).embeddings.create(
            model="tiny-embed", input="hello"
        )
    with pytest.raises(openai.NotFoundError):
        other.embeddings.create(model="nope", input="hello")


def test_the_tpm_limit_refuses_an_oversized_batch_with_429(gw: Gateway) -> None:
    small = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["small"], max_retries=0)
    assert small.embeddings.create(model="tiny-embed", input="hello").usage.prompt_tokens < 40
    with pytest.raises(openai.RateLimitError) as info:
        small.embeddings.create(model="tiny-embed", input=["hello world the model"] * 10)
    assert info.value.status_code == 429 and info.value.body["code"] == "request_too_large"  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": []}, "invalid_request", "input"),
        ({"input": ""}, "invalid_request", "input"),
        ({"input": ["a", ""]}, "invalid_request", "input"),
        ({"input": [1, 2, 3]}, "unsupported_parameter", "input"),
        ({"input": [[1, 2], [3]]}, "unsupported_parameter", "input"),
        ({"input": ["a", 1]}, "invalid_type", "input"),
        ({"input": ["a"] * 2049}, "invalid_request", "input"),
        ({"input": "hello " * 300}, "context_length_exceeded", "input"),
        ({"input": "a", "dimensions": 8}, "unsupported_parameter", "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "invalid_request", "encoding_format"),
        ({"input": "a", "user": "a\x00b"}, "invalid_request", "user"),
        ({}, "invalid_request", "input"),
    ],
)
def test_bad_bodies_are_a_400_in_openai_shape(gw: Gateway, body: dict[str, Any], code: str, param: str) -> None:
    r = httpx.post(
        gw.api_url + "/embeddings",
        json={"model": "tiny-embed", **body},
        headers={"Authorization": f"Bearer {gw.keys['acme']}"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error"), error


def test_a_client_that_leaves_cancels_the_embedding_and_releases_everything(gw: Gateway) -> None:
    engine = gw.gateway.registry.resolve("slow-embed", embeddings=True).engine
    payload = json.dumps({"model": "slow-embed", "input": ["one", "two"]}).encode()
    calls = engine.embedding_calls
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
    try:
        sock.sendall(
            f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.keys['acme']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        wait_for(lambda: engine.active_slots == 1 and engine.embedding_calls > calls, what="the embedding started")
    finally:
        sock.close()
    wait_for(lambda: engine.active_slots == 0 and gw.gateway.in_flight == 0, what="everything released")
    rows = [r for r in gw.usage_rows() if r.model == "slow-embed"]
    assert [(r.status, r.error_code, r.endpoint) for r in rows] == [(499, "client_disconnected", "embeddings")]
    assert gw.gateway.limiter.holders == 0


def test_a_shutdown_cuts_a_running_embedding_with_503(tmp_path: Path) -> None:
    g = start_gateway(
        tmp_path,
        seed_with={"models": {"slow": sim_model("slow", embeddings=True, embed_ms=120_000)}, "tenants": {"acme": {}}},
        usage_flush_interval_s=0.05,
    )
    try:
        engine = g.gateway.registry.resolve("slow", embeddings=True).engine
        out: list[httpx.Response] = []
        body = {"model": "slow", "input": "wait"}
        headers = {"Authorization": f"Bearer {g.keys['acme']}"}
        client = threading.Thread(
            target=lambda: out.append(httpx.post(g.api_url + "/embeddings", json=body, headers=headers, timeout=30))
        )
        client.start()
        wait_for(lambda: engine.active_slots == 1, what="the embedding started")
        g.server.call(g.gateway.drain(0.05))  # the drain time passes: running requests are cut
        client.join(30)
        [r] = out
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert engine.active_slots == 0 and g.gateway.in_flight == 0
        [row] = g.usage_rows()
        assert (row.status, row.error_code, row.endpoint) == (503, "shutting_down", "embeddings")
    finally:
        g.stop()


# ---- vLLM: /v1/embeddings of a pooling model ----------------------------------------------------


async def test_vllm_adapter_embeds_through_the_servers_endpoint(vllm: VLLMStandIn) -> None:
    config = {"base_url": vllm.base_url, "model": "m", "metrics_poll_s": 0, "embeddings": True}  # type: ignore[attr-defined]
    engine = VLLMEngine("e", config)
    assert "embeddings" in engine.info.capabilities and not engine.info.generates
    await engine.start()
    try:
        result = await engine.embed(EmbeddingRequest("emb-1", ("a b", "c", "a b"), 3, priority=2))
        sent = vllm.requests[-1]
        assert (sent["_path"], sent["_request_id"], sent["model"]) == ("/v1/embeddings", "emb-1", "m")
        assert sent["input"] == ["a b", "c", "a b"] and sent["priority"] == 2
        assert result.prompt_tokens == 5 and result.vectors.shape == (3, vllm.embedding_dim)
        expected = np.array([vllm.vector(t) for t in ("a b", "c", "a b")], dtype=np.float32)
        expected /= np.linalg.norm(expected, axis=1, keepdims=True)
        assert np.allclose(result.vectors, expected, atol=1e-6)  # in input order (the stand-in answers reversed)
    finally:
        await engine.close()


def test_vllm_embeddings_through_the_gateway_and_an_abort_reaching_the_engine(
    gw: Gateway, client: openai.OpenAI, vllm: VLLMStandIn
) -> None:
    raw = client.embeddings.with_raw_response.create(model="vllm-embed", input=["one two", "three"])
    r = raw.parse()
    assert [len(d.embedding) for d in r.data] == [vllm.embedding_dim] * 2
    assert r.usage.prompt_tokens == 3  # the count vLLM reports
    assert row_of(gw, raw.headers["x-request-id"]).prompt_tokens == 3
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="vllm-embed", prompt="hi", max_tokens=2)
    # A client that gives up: the gateway closes its request to vLLM, which aborts it.
    vllm.embed_delay_s = 60
    try:
        quick = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0, timeout=0.5)
        with pytest.raises(openai.APITimeoutError):
            quick.embeddings.create(model="vllm-embed", input="slow")
        wait_for(
            lambda: any(x["input"] == ["slow"] and x["_request_id"] in vllm.cancelled for x in vllm.requests),
            what="the abort reaching vLLM",
        )
        wait_for(lambda: gw.gateway.in_flight == 0, what="the lease released")
    finally:
        vllm.embed_delay_s = 0


# ---- the llama.cpp adapter itself ---------------------------------------------------------------


async def test_llamacpp_pooling_is_configurable_and_an_embedder_does_not_generate(demo_model_path: Path) -> None:
    with pytest.raises(EngineError, match="pooling must be one of"):
        LlamaCppEngine("x", {"model_path": str(demo_model_path), "embedding": True, "pooling": "none"})
    vectors = {}
    for pooling in ("mean", "last", None):
        config = {"model_path": str(demo_model_path), "embedding": True, "parallel": 1, "n_ctx": 128}
        engine = LlamaCppEngine("x", {**config, "pooling": pooling} if pooling else config)
        await engine.start()
        try:
            request = EmbeddingRequest("e", ("hello world", "the model"), 0)
            vectors[pooling] = (await engine.embed(request)).vectors
            with pytest.raises(EngineError, match="embeddings only"):
                await anext(engine.generate(GenerationRequest("g", "hi", 2, 2)))
        finally:
            await engine.close()
    assert np.array_equal(vectors[None], vectors["mean"])  # the demo model declares no pooling: mean
    assert not np.allclose(vectors["mean"], vectors["last"])


async def test_llamacpp_embedding_cancelled_gives_its_context_back(demo_model_path: Path) -> None:
    engine = LlamaCppEngine("x", {"model_path": str(demo_model_path), "embedding": True, "parallel": 1})
    await engine.start()
    try:
        task = asyncio.ensure_future(engine.embed(EmbeddingRequest("long", ("hello world the model",) * 2000, 0)))
        await until(lambda: engine.active_slots, step=0.001, what="the embedding under way")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The worker stops between inputs and only then lets go of the context: the next call gets it.
        again = await asyncio.wait_for(engine.embed(EmbeddingRequest("next", ("hello",), 0)), timeout=10)
        assert again.vectors.shape == (1, engine.n_embd) and engine.active_slots == 0
    finally:
        await engine.close()
