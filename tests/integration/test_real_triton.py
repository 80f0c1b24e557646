"""The TensorRT-LLM adapter against a real tritonserver (2.51, from nvidia-pytriton) serving a
Python-backend model with the ensemble's tensors (tests/triton_model/model.py), through a real
gateway and the official openai SDK: streaming and not, stop sequences, max_tokens, usage,
penalties, cancellation reaching the server, a server killed mid-stream, a server down at start.

scripts/install-engines provides the server (cached); without it these tests skip, or fail
under CI=true."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from laneway.engines.base import EngineError
from laneway.engines.trtllm import TritonTRTLLMEngine
from laneway.types import GenerationRequest
from support import Gateway, free_port, sim_model, start_gateway, wait_for
from support.engines_real import RealTriton, ensure_triton

TOKEN_DELAY_S = 0.01  # per word: a 2000-token request would run 20 s, so a finished one proves nothing was cut


def trt(name: str, url: str, **config: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "engine_kind": "trtllm",
            "quantization": "fp8",
            "gpu_type": "cpu",
            "max_model_len": 4096,
            "config": {"url": url, **config},
        }
    ]


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealTriton]:
    ensure_triton()
    server = RealTriton(tmp_path_factory.mktemp("triton"), token_delay_s=TOKEN_DELAY_S).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def doomed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealTriton]:
    """A second server, for the tests that kill it."""
    ensure_triton()
    server = RealTriton(tmp_path_factory.mktemp("triton-doomed"), token_delay_s=TOKEN_DELAY_S).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, triton: RealTriton, doomed: RealTriton) -> Iterator[Gateway]:
    models = {"trt": trt("trt-1", triton.url), "trt-doomed": trt("trt-doomed-1", doomed.url), "sim": sim_model("sim")}
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw"),
        seed_with={"models": models, "tenants": {"acme": {}}},
        policy_poll_interval_s=0.2,
        usage_flush_interval_s=0.05,
    )
    yield gateway
    gateway.stop()


@pytest.fixture
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0, timeout=30)


def received_with(server: RealTriton, marker: str) -> dict[str, Any]:
    """The one request whose prompt carries `marker`, as the model received it."""
    found = [r for r in server.received() if marker in r["inputs"]["text_input"][0]]
    assert len(found) == 1, found
    return found[0]


def words(client: openai.OpenAI, marker: str, n: int, seed: int) -> list[str]:
    """What the model says for this seed (its words depend only on the seed)."""
    r = client.completions.create(model="trt", prompt=marker, max_tokens=n, seed=seed)
    return r.choices[0].text.split()


# ---- the OpenAI surface over real Triton ----


def test_chat_streamed_and_not_reach_triton_as_the_ensemble_and_count_right(
    client: openai.OpenAI, triton: RealTriton
) -> None:
    marker = uuid.uuid4().hex
    r = client.chat.completions.create(
        model="trt", messages=[{"role": "user", "content": f"hello {marker}"}], max_tokens=5, seed=11, temperature=0.5
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length" and len(choice.message.content.split()) == 5
    assert r.usage is not None and r.usage.completion_tokens == 5 and r.usage.prompt_tokens > 0
    assert r.system_fingerprint == "laneway-trtllm"
    record = received_with(triton, marker)
    sent = record["inputs"]
    assert sent["max_tokens"] == [5] and sent["stream"] == [True] and sent["random_seed"] == [11]
    assert sent["temperature"] == [0.5] and "presence_penalty" not in sent and "frequency_penalty" not in sent
    assert triton.ended(record["id"]) == {"event": "completed", "id": record["id"], "tokens": 5}

    marker2 = uuid.uuid4().hex
    stream = client.chat.completions.create(
        model="trt",
        messages=[{"role": "user", "content": f"hello {marker2}"}],
        max_tokens=5,
        seed=11,
        temperature=0.5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # one word per response, streamed as it came
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_completions_streamed_and_not_and_stop_before_max_tokens(client: openai.OpenAI, triton: RealTriton) -> None:
    said = words(client, uuid.uuid4().hex, 8, seed=5)
    assert len(said) == 8
    stop = said[3]
    before = said[: said.index(stop)]
    marker = uuid.uuid4().hex
    r = client.completions.create(model="trt", prompt=marker, max_tokens=200, seed=5, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text.split() == before
    # Triton stopped at the stop word (it was sent as stop_words), not after 200 tokens; the
    # word that completed it was generated, so it is billed.
    record = received_with(triton, marker)
    assert record["inputs"]["stop_words"] == [stop]
    assert triton.ended(record["id"])["tokens"] == len(before) + 1
    assert r.usage is not None and r.usage.completion_tokens == len(before) + 1

    chunks = list(client.completions.create(model="trt", prompt="x", max_tokens=200, seed=5, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices).split() == before
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]

    chunks = list(client.completions.create(model="trt", prompt="x", max_tokens=3, seed=5, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices).split() == said[:3]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_penalties_reach_the_model_as_the_ensembles_tensors(client: openai.OpenAI, triton: RealTriton) -> None:
    marker = uuid.uuid4().hex
    r = client.completions.create(
        model="trt", prompt=marker, max_tokens=10, seed=1, presence_penalty=0.5, frequency_penalty=0.25
    )
    sent = received_with(triton, marker)["inputs"]
    assert sent["presence_penalty"] == [0.5] and sent["frequency_penalty"] == [0.25]
    assert len(set(r.choices[0].text.split())) == 10  # the model repeats no word under a presence penalty


def test_the_adapter_sends_no_reserved_triton_parameters(triton: RealTriton) -> None:
    """tritonclient's aio client refuses `triton_`-prefixed request parameters (Triton reserves
    them); the adapter sends none at all: the ensemble reads everything from tensors."""
    engine = TritonTRTLLMEngine("trt", {"url": triton.url})
    sent = engine.request(GenerationRequest("p-1", "hi", 1, 3, stop=("a",), seed=2, presence_penalty=0.1))
    assert "parameters" not in sent
    assert not [t.name() for t in sent["inputs"] if t.name().startswith("triton_")]


# ---- cancellation and failures ----


def test_a_client_that_disconnects_mid_stream_cancels_the_request_on_triton(
    client: openai.OpenAI, gw: Gateway, triton: RealTriton
) -> None:
    marker = uuid.uuid4().hex
    with client.chat.completions.create(
        model="trt", messages=[{"role": "user", "content": marker}], max_tokens=2000, stream=True
    ) as stream:
        for i, _ in enumerate(stream):
            if i == 3:
                break  # leaving the block closes the connection
    request_id = received_with(triton, marker)["id"]
    outcome = triton.ended(request_id)
    assert outcome["event"] == "cancelled" and outcome["tokens"] < 100, outcome
    wait_for(lambda: gw.engine("trt").active_slots == 0, within=5, what="the engine slot freed")


def test_a_triton_killed_mid_stream_is_an_engine_error_and_the_gateway_serves_on(
    client: openai.OpenAI, gw: Gateway, doomed: RealTriton
) -> None:
    stream = client.chat.completions.create(
        model="trt-doomed", messages=[{"role": "user", "content": "hi"}], max_tokens=2000, stream=True
    )
    got = 0
    with pytest.raises(openai.APIError) as raised:
        for _chunk in stream:
            got += 1
            if got == 3:
                doomed.kill()
    assert 3 <= got < 2000 and raised.value.code == "engine_error"
    assert "engine" in raised.value.message.lower() and "broke the stream" in raised.value.message, raised.value.message
    # The next request finds it down: 503 engine_error in OpenAI's shape, not a 500.
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="trt-doomed", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert refused.value.status_code == 503 and refused.value.code == "engine_error", refused.value.body
    # Everything else is untouched: the other Triton, the sim, liveness; no slot leaked.
    assert client.completions.create(model="trt", prompt="x", max_tokens=2).choices[0].finish_reason == "length"
    assert client.completions.create(model="sim", prompt="x", max_tokens=2).usage.completion_tokens == 2  # type: ignore[union-attr]
    assert httpx.get(gw.base_url + "/health/live").status_code == 200
    assert gw.engine("trt-doomed").active_slots == 0

    # Triton back on the same address: the deployment serves again once its health check passes.
    doomed.restart()

    def serves() -> bool:
        try:
            client.completions.create(model="trt-doomed", prompt="x", max_tokens=2)
        except openai.APIStatusError:
            return False
        return True

    wait_for(serves, within=30, step=0.2, what="the deployment serving again")


async def test_the_adapter_raises_engine_error_when_the_stream_breaks(tmp_path: Path) -> None:
    """At the adapter: a killed server mid-stream is EngineError (the pipeline's 503), never the
    raw grpc.aio.AioRpcError (which the pipeline would answer 500)."""
    server = RealTriton(tmp_path, token_delay_s=TOKEN_DELAY_S).start()
    engine = TritonTRTLLMEngine("trt", {"url": server.url})
    try:
        await engine.start()
        stream = engine.generate(GenerationRequest("kill-1", "x", 1, 2000))
        await anext(stream)
        server.kill()
        with pytest.raises(EngineError, match="UNAVAILABLE"):
            async for _ in stream:
                pass
        assert engine.active_slots == 0
    finally:
        await engine.close()
        server.stop()


async def test_start_against_an_unreachable_triton_says_so() -> None:
    engine = TritonTRTLLMEngine("trt", {"url": f"127.0.0.1:{free_port()}", "probe_timeout_s": 2})
    with pytest.raises(EngineError, match="is unreachable") as raised:
        await engine.start()
    assert "UNAVAILABLE" in str(raised.value)
    assert await engine.health() is False


class Records(logging.Handler):
    """Every record of a logger (caplog's root handler does not survive the app's logging config)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def laneway_log() -> Iterator[Records]:
    logger, handler = logging.getLogger("laneway"), Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_gateway_started_while_triton_is_down_is_unready_says_why_once_then_serves_it(
    tmp_path: Path, laneway_log: Records
) -> None:
    ensure_triton()
    server = RealTriton(tmp_path / "triton", token_delay_s=TOKEN_DELAY_S)
    server.port = free_port()  # its address is configured before it runs
    url = f"127.0.0.1:{server.port}"
    (tmp_path / "gw").mkdir()
    log = laneway_log.records
    gw = start_gateway(
        tmp_path / "gw",
        wait_ready=False,
        policy_poll_interval_s=0.1,
        metrics_token="t",
        seed_with={"models": {"late": trt("late-1", url), "sim": sim_model("sim")}, "tenants": {"acme": {}}},
    )
    try:
        ready = httpx.get(gw.base_url + "/health/ready", headers={"Authorization": "Bearer t"})  # with the reasons
        assert ready.status_code == 503 and "late-1" in ready.json()["failed"], ready.text
        assert f"Triton at {url} is unreachable" in ready.json()["failed"]["late-1"]
        # Many sync polls retry it while it stays down; it stays unready, and says so once.
        polls = len([r for r in log if "late-1" in r.getMessage()])
        wait_for(
            lambda: len([r for r in log if "late-1" in r.getMessage()]) >= polls + 5,
            within=60,
            what="the sync retrying the deployment",
        )
        assert httpx.get(gw.base_url + "/health/ready").status_code == 503
        errors = [r.getMessage() for r in log if r.levelno >= logging.ERROR]
        assert errors == [f"deployment late-1 (trtllm) failed to start: {ready.json()['failed']['late-1']}"], errors
        assert not [r for r in log if r.exc_info]  # no traceback
        c = openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        assert c.completions.create(model="sim", prompt="x", max_tokens=2).choices[0].finish_reason == "length"

        server.start(port=server.port)  # Triton comes up: the next sync starts the deployment
        wait_for(
            lambda: httpx.get(gw.base_url + "/health/ready").status_code == 200,
            within=90,
            step=0.05,
            what="the gateway ready",
        )
        assert c.completions.create(model="late", prompt="x", max_tokens=3).usage.completion_tokens == 3  # type: ignore[union-attr]
    finally:
        gw.stop()
        server.stop()


async def test_a_triton_replica_restarted_under_20_streams_costs_no_stream_that_had_not_started(
    tmp_path: Path, triton: RealTriton
) -> None:
    """Issue 31: a real engine replica killed (then restarted) while 20 clients stream: the
    streams that had not started are served by the other replica, those mid-stream on it end
    with an error event, none hangs, none fails before its first byte."""
    (tmp_path / "victim").mkdir()
    (tmp_path / "gw").mkdir()
    victim = RealTriton(tmp_path / "victim", token_delay_s=TOKEN_DELAY_S).start()
    models = {"pair": [*trt("pair-victim", victim.url), *trt("pair-steady", triton.url)]}
    gw = await asyncio.to_thread(
        start_gateway,
        tmp_path / "gw",
        seed_with={"models": models, "tenants": {"acme": {}}},
        usage_flush_interval_s=0.05,
        retry_budget_min=100,
    )
    try:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0, timeout=60)

        async def one(i: int) -> str:
            chunks = 0
            try:
                stream = await client.completions.create(model="pair", prompt=f"p{i}", max_tokens=60, stream=True)
                async for chunk in stream:
                    chunks += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        return "done"
            except openai.APIError:
                assert chunks > 0, f"stream {i} failed before its first byte"
                return "cut mid-stream"
            return "no finish"

        async def restart_soon() -> None:
            await asyncio.sleep(0.3)  # time passing is the point: streams running on both, the rest waiting
            await asyncio.to_thread(victim.kill)
            await asyncio.sleep(0.5)  # down for a while: the streams on it cut, the waiting ones elsewhere
            await asyncio.to_thread(victim.start, port=victim.port)

        outcomes, _ = await asyncio.gather(asyncio.gather(*(one(i) for i in range(20))), restart_soon())
        assert set(outcomes) <= {"done", "cut mid-stream"} and outcomes.count("done") >= 10, outcomes
        rows = await asyncio.to_thread(gw.usage_rows, "acme")
        assert len(rows) == 20 and gw.gateway.in_flight == 0
        cut = [r for r in rows if r.status != 200]
        assert all(r.deployment == "pair-victim" and r.error_code == "engine_error" for r in cut)
        moved = [r for r in rows if r.tries > 1]
        assert cut or moved, "the victim held no stream when it was killed"
        assert all(r.status == 200 and r.failed_deployments == "pair-victim" for r in moved)
    finally:
        await asyncio.to_thread(gw.stop)
        victim.stop()
