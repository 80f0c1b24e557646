"""An engine kind is one descriptor, registered once (engines/kinds.py): a newcomer's single
`register_engine_kind` call (here through the `engine_kind` fixture) is all it takes for its
config to be checked, the CLI to offer it, the admin form to show it and the registry to build
and serve its deployments. A deployment naming a kind nobody registered is refused by name."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Unpack

import msgspec
import pytest
from laneway.admin import engine_forms
from laneway.admin.deployments import DeploymentIn, ModelIn, check_deployments
from laneway.cli.parser import build_parser
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import DeploymentSpec
from laneway.engines.adapter import DeploymentFacts, EngineAdapter
from laneway.engines.config import DeploymentConfig, EngineConfigError, SimConfig
from laneway.engines.extras import Extra
from laneway.engines.kinds import (
    EngineKind,
    check_config,
    engine_kind_names,
    engine_kinds,
    register_engine_kind,
)
from laneway.engines.registry import EngineRegistry
from laneway.engines.sim import SimEngine
from laneway.types import Delta, GenerationRequest
from support.engine_kinds import registered_kind

RegisterKind = Callable[[EngineKind], EngineKind]


# The newcomer: its typed config and its adapter (what the shared base does not do for it:
# the base keeps the alias and the row's facts, decodes the config, estimates prompt tokens).
class EchoConfig(DeploymentConfig, kw_only=True):
    kind: ClassVar[str] = "echo"
    reply: str  # required: a config without it is refused by name
    slots: int = 2


class EchoEngine(EngineAdapter[EchoConfig]):
    engine = "echo"
    config_type = EchoConfig

    def __init__(self, alias: str, config: Mapping[str, Any] | EchoConfig, **row: Unpack[DeploymentFacts]) -> None:
        super().__init__(alias, config, **row)
        self.info = self.describe(context=self.max_model_len or 1024, slots=self.config.slots)
        self.active_slots = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta, None]:
        yield Delta(text=self.config.reply, tokens=1, finish_reason="stop")

    async def warmup(self, prompts: Sequence[str]) -> None:
        pass

    async def health(self) -> bool:
        return True


ECHO = EngineKind("echo", EchoConfig, EchoEngine, description="Says its config's reply.")


def spec(kind: str, config: dict[str, Any], name: str = "m-1") -> DeploymentSpec:
    return DeploymentSpec(
        0, name=name, alias="m", engine_kind=kind, config=config, quantization="q4", gpu_type="cpu", max_model_len=512
    )


async def test_one_registration_reaches_config_checks_the_cli_the_admin_form_and_the_registry(
    engine_kind: RegisterKind,
) -> None:
    engine_kind(ECHO)  # the one place a newcomer touches

    # Config parsing: checked by its own struct before anything is written.
    check_config("echo", {"reply": "hi"})
    with pytest.raises(EngineConfigError) as refused:
        check_config("echo", {"slots": 3})
    assert str(refused.value) == "echo needs config key 'reply'" and refused.value.key == "reply"

    # The CLI offers it.
    args = build_parser().parse_args(["model", "set", "m", "--engine", "echo", "--config", '{"reply": "hi"}'])
    assert args.engine == "echo"

    # The admin UI: in the kind choices, with a typed form from its struct, read back through it.
    assert "echo" in engine_forms.kinds() and engine_forms.kind_description("echo") == "Says its config's reply."
    fields = {f.help.name: f for f in engine_forms.config_fields("echo")}
    assert fields["reply"].required and fields["slots"].help.kind == "number" and fields["slots"].default == 2
    assert engine_forms.read_config("echo", {"config.reply": "hi", "config.slots": "3"}, {}) == {
        "reply": "hi",
        "slots": 3,
    }
    # The admin API takes a deployment of it (and refuses its config by its struct).
    model = ModelIn(deployments=[DeploymentIn(name="m-1", engine_kind="echo", config={"reply": "hi"})])
    assert check_deployments(model) == ["m-1"]
    with pytest.raises(GatewayError, match="echo needs config key 'reply'"):
        check_deployments(msgspec.structs.replace(model, deployments=[DeploymentIn(name="m-1", engine_kind="echo")]))

    # The registry builds its deployment and serves from it, with the row's facts in its info.
    registry = EngineRegistry()
    await registry.load([spec("echo", {"reply": "hello"})])
    try:
        served = registry.resolve("m")
        assert isinstance(served.engine, EchoEngine) and not served.shared  # not remote: no shared slots
        info = served.engine.info
        assert (info.engine, info.quantization, info.gpu_type, info.max_model_len, info.max_concurrency) == (
            "echo",
            "q4",
            "cpu",
            512,
            2,
        )
        request = GenerationRequest(request_id="r", prompt="x", prompt_tokens=1, max_tokens=4)
        assert [d.text async for d in served.engine.generate(request)] == ["hello"]
    finally:
        await registry.close()


async def test_a_deployment_naming_an_unregistered_kind_is_refused_by_name() -> None:
    with registered_kind(ECHO):
        assert "echo" in engine_kind_names()
    assert "echo" not in engine_kind_names()  # the fixture's registration ends with the test
    known = "llamacpp, sim, trtllm, vllm"

    registry = EngineRegistry()
    await registry.load([spec("echo", {"reply": "hi"})])
    assert registry.failed == {"m-1": f"unknown engine kind 'echo' (known: {known})"}
    await registry.close()

    model = ModelIn(deployments=[DeploymentIn(name="m-1", engine_kind="echo")])
    with pytest.raises(GatewayError) as refused:
        check_deployments(model)
    assert str(refused.value) == f"Unknown engine kind 'echo' (known: {known})."
    assert refused.value.param == "deployments[0].engine_kind"
    with pytest.raises(SystemExit):  # argparse: invalid choice
        build_parser().parse_args(["model", "set", "m", "--engine", "echo"])


class FarEchoConfig(EchoConfig, kw_only=True):
    kind: ClassVar[str] = "far-echo"
    shared_slots: bool = True  # as every remote kind's config (engines/config.py, RemoteEngineConfig)


class FarEchoEngine(EchoEngine):
    config_type = FarEchoConfig


async def test_a_remote_kind_shares_its_slots_unless_its_config_opts_out(engine_kind: RegisterKind) -> None:
    engine_kind(EngineKind("far-echo", FarEchoConfig, FarEchoEngine, remote=True))
    registry = EngineRegistry()
    far = {"reply": "hi"}
    await registry.load([spec("far-echo", far), spec("far-echo", {**far, "shared_slots": False}, name="m-2")])
    try:
        assert {d.spec.name: d.shared for d in registry.deployments()} == {"m-1": True, "m-2": False}
    finally:
        await registry.close()


async def test_a_kind_whose_extra_is_missing_fails_to_start_naming_it(engine_kind: RegisterKind) -> None:
    needs = Extra("echo", "echo deployments need", ("no_such_module_xyz",))
    engine_kind(EngineKind("echo", EchoConfig, EchoEngine, extra=needs))
    registry = EngineRegistry()
    await registry.load([spec("echo", {"reply": "hi"})])
    assert registry.failed == {
        "m-1": "echo deployments need `pip install laneway[echo]` (no_such_module_xyz is not installed)"
    }
    await registry.close()


def test_a_name_is_registered_once(engine_kind: RegisterKind) -> None:
    engine_kind(ECHO)
    with pytest.raises(ValueError, match="engine kind 'echo' is registered already"):
        register_engine_kind(EngineKind("echo", SimConfig, SimEngine))
    with pytest.raises(ValueError, match="'sim' is registered already"):
        register_engine_kind(EngineKind("sim", SimConfig, SimEngine))


def test_every_extra_a_kind_needs_is_an_extra_of_the_distribution() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    offered = pyproject["project"]["optional-dependencies"]
    needed = {k.name: k.extra.name for k in engine_kinds() if k.extra is not None}
    assert needed == {"llamacpp": "llamacpp", "trtllm": "trtllm"}
    assert set(needed.values()) <= set(offered)
