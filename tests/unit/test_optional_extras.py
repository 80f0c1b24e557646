"""The base install (no llama.cpp, no Triton client) imports, starts and serves; what needs a
missing extra says which one in a line. In a subprocess whose sys.modules makes llama_cpp,
gguf and tritonclient unimportable, as when the extras are not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from laneway.engines import extras

WITHOUT_EXTRAS = r"""
import sys
for name in ("llama_cpp", "gguf", "tritonclient"):
    sys.modules[name] = None  # `import` raises ModuleNotFoundError, as when it is not installed

import asyncio, json, pathlib
import httpx
import laneway.app
from laneway.cli import main, preflight
from laneway.db.repositories import DeploymentSpec
from laneway.embedded import EmbeddedServer
from laneway.engines.registry import EngineRegistry, EngineStartError
from laneway.settings import Settings

data = pathlib.Path(sys.argv[1])
out = {}
# The embedded defaults: the demo model is skipped (it runs on llama.cpp), the rest is seeded;
# not ready (no model) until one is added.
app = laneway.app.create_app(Settings(data_dir=data, shed_loop_delay_s=0, metrics_token="t"))
server = EmbeddedServer(app).start(wait_ready=False)
try:
    ready = httpx.get(server.base_url + "/health/ready", headers={"Authorization": "Bearer t"})  # the details
    out["ready"] = [ready.status_code, ready.json()]
    out["login"] = httpx.get(server.base_url + "/admin/login").status_code
finally:
    server.stop()
out["demo_key"] = (data / "demo-api-key").is_file()
out["admin_password"] = (data / "admin-password").is_file()

def spec(kind, config):
    return DeploymentSpec(0, name=f"m-{kind}", alias="m", engine_kind=kind, config=config,
                          quantization="q", gpu_type="cpu", max_model_len=256)

async def deployments():
    registry = EngineRegistry()
    await registry.load([spec("llamacpp", {"model_path": str(data / "models" / "none.gguf")}),
                         spec("trtllm", {"url": "127.0.0.1:1"})])
    try:  # the admin service's path: a model change whose engine cannot start
        await registry.start([spec("llamacpp", {"model_path": "x.gguf"})])
    except EngineStartError as exc:
        out["start"] = exc.reason
    await registry.close()
    return registry.failed

out["failed"] = asyncio.run(deployments())
out["preflight_smollm2"] = preflight(Settings(data_dir=data, demo_model="smollm2"))
try:
    main(["make-demo-model", "--out", str(data / "x.gguf")])
except SystemExit as exc:
    out["make_demo_model"] = str(exc.code)
out["still_absent"] = [n for n in ("llama_cpp", "gguf", "tritonclient") if sys.modules.get(n) is not None]
print(json.dumps(out))
"""

LLAMACPP = "llama.cpp deployments need `pip install laneway[llamacpp]` (llama_cpp is not installed)"
TRTLLM = "TensorRT-LLM (Triton) deployments need `pip install laneway[trtllm]` (tritonclient is not installed)"


def test_laneway_runs_without_the_engine_extras_and_names_the_one_a_deployment_needs(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    status, ready = out["ready"]
    assert status == 503 and ready["models"] == [] and ready["failed"] == {}, ready  # up, with no model yet
    assert out["login"] == 200 and out["demo_key"] and out["admin_password"]
    assert "no demo model: the demo model (llama.cpp) needs `pip install laneway[llamacpp]`" in run.stderr
    assert out["failed"] == {"m-llamacpp": LLAMACPP, "m-trtllm": TRTLLM}
    assert out["start"] == LLAMACPP
    assert out["preflight_smollm2"] == (
        "the demo model (llama.cpp) needs `pip install laneway[llamacpp]` (gguf is not installed)"
    )
    assert out["make_demo_model"] == (
        "laneway: writing the demo model needs `pip install laneway[llamacpp]` (gguf is not installed)"
    )
    assert out["still_absent"] == []


def test_an_installed_extra_is_not_reported_missing() -> None:
    # This environment has both extras (dev): nothing to say, and the check imports what it names.
    assert extras.missing_extra(extras.LLAMACPP) is None
    assert extras.missing_extra(extras.TRTLLM) is None
    assert extras.missing_extra(extras.DEMO_MODEL) is None


def test_a_missing_dependency_of_an_extra_is_named() -> None:
    absent = extras.Extra("trtllm", "TensorRT-LLM (Triton) deployments need", ("json", "no_such_module_xyz.grpc"))
    error = extras.missing_extra(absent)
    assert error is not None and str(error) == (
        "TensorRT-LLM (Triton) deployments need `pip install laneway[trtllm]` (no_such_module_xyz is not installed)"
    )
