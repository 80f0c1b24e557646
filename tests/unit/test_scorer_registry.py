"""Scorers are registered once by name and the routing profile picks them with their weights
(core/dispatch/scorers/): a new scorer is one class and one `register_scorer` call, here in
this module, and naming it in the profile is all it takes for dispatch to use it. A profile
that names an unknown scorer or a bad weight stops the start, naming it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import ClassVar

import pytest
from laneway.cli import preflight
from laneway.core.dispatch import Route, RoutingParams
from laneway.core.dispatch.scorers import Candidate, PrefixScorer, parse_profile, register_scorer
from laneway.core.pipeline import Gateway, GenerationIntent
from laneway.core.pipeline.config import GatewayConfig
from laneway.core.policy import PolicyStore
from laneway.engines.registry import EngineRegistry
from laneway.settings import Settings
from laneway.types import DeploymentSpec, TenantSnapshot
from support.pipeline import run_admitted
from support.specs import sim_replica

ACME = TenantSnapshot(id=1, name="acme", api_key_id=11)
SYSTEM = "You are a careful assistant for the billing team. " * 40  # several prefix blocks
FAVOURITE = "m-2"


class Favourite:
    """The newcomer: a bonus for one replica by name (as an operator might favour a new GPU)."""

    affinity: ClassVar[bool] = False  # not a cache bonus: the imbalance guard leaves it alone
    precedence: ClassVar[int] = 5  # it names the placement before session, prefix and load

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def score(self, c: Candidate, route: Route) -> float:
        return self.weight if c.name == FAVOURITE else 0.0

    def explains(self, chosen: Candidate, candidates: Sequence[Candidate]) -> bool:
        return chosen.name == FAVOURITE


register_scorer("favourite", Favourite)  # the one place a newcomer touches


def spec(i: int) -> DeploymentSpec:
    return sim_replica(i, decode_ms_base=1.0, prefill_ms_per_token=0.0, max_concurrency=2)


@pytest.fixture
async def replicas() -> AsyncIterator[EngineRegistry]:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1), spec(2)])
    yield registry
    await registry.close()


async def placements(registry: EngineRegistry, profile: str, prompts: Sequence[str]) -> list[tuple[str, str | None]]:
    """Where each prompt, sent one after another, was served and why, under `profile`."""
    gw = Gateway(
        registry, PolicyStore(None), config=GatewayConfig(routing_params=RoutingParams(profile=parse_profile(profile)))
    )
    out = []
    for prompt in prompts:
        # One token: where it was placed is the point, not what it generated (the default is hundreds).
        intent = GenerationIntent(endpoint="completions", alias="m", stream=False, prompt=prompt, max_tokens=1)
        call = await gw.prepare(ACME, intent)
        await run_admitted(gw, call)
        out.append((call.deployment.spec.name, call.route_reason))
    return out


NEW_PROMPTS = [f"question number {i}, asked once" for i in range(8)]


async def test_a_scorer_registered_here_and_named_in_the_profile_decides_the_placement(
    replicas: EngineRegistry,
) -> None:
    default = await placements(replicas, "prefix=1.0,session=0.5,load=0.5", NEW_PROMPTS)
    assert len({name for name, _ in default}) > 1  # without it, new prompts spread by their hash
    favoured = await placements(replicas, "favourite=2.0,prefix=1.0,session=0.5,load=0.5", NEW_PROMPTS)
    assert favoured == [(FAVOURITE, "favourite")] * len(NEW_PROMPTS)


async def test_a_scorer_the_profile_leaves_out_is_not_used(replicas: EngineRegistry) -> None:
    with_prefix = await placements(replicas, "prefix=1.0,load=0.5", [SYSTEM + "first", SYSTEM + "second"])
    assert with_prefix[1] == (with_prefix[0][0], "prefix")
    without = await placements(replicas, "load=0.5", [SYSTEM + "third", SYSTEM + "fourth"])
    assert all(reason != "prefix" for _, reason in without)


async def test_the_reason_is_the_most_specific_scorer_that_explains_it(replicas: EngineRegistry) -> None:
    """A next turn that holds both its session and its prefix is named by the session, as before
    the registry, whatever order the profile lists them in."""
    gw = Gateway(
        replicas,
        PolicyStore(None),
        config=GatewayConfig(routing_params=RoutingParams(profile=parse_profile("prefix=1,session=0.5"))),
    )
    assert [s.name for s in gw.waiting.dispatch.picker.scorers] == ["prefix", "session"]
    for turn, expected in ((SYSTEM + "Q: my invoice?", None), (SYSTEM + "Q: my invoice? A: sent. Q: when?", "session")):
        intent = GenerationIntent(endpoint="completions", alias="m", stream=False, prompt=turn, prompt_cache_key="c1")
        call = await gw.prepare(ACME, intent)
        (await gw.admit(call)).release()
        if expected is not None:
            assert call.route_reason == expected and call.cached_estimate > 0  # the prefix held too


def test_the_profile_comes_from_one_setting() -> None:
    params = RoutingParams.from_settings(Settings(routing_profile=" favourite = 1.5 , load=0.25 "))
    assert params.profile == (("favourite", 1.5), ("load", 0.25))
    assert RoutingParams.from_settings(Settings()) == RoutingParams()
    # ttft decides in seconds where the replicas' latency models are warm; the rest while one is cold.
    assert RoutingParams().profile == (("prefix", 1.0), ("session", 0.5), ("load", 0.5), ("ttft", 1.0))


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("prefix=1.0,sesion=0.5", "unknown scorer 'sesion' (known: "),
        ("prefix=heavy", "scorer 'prefix' has weight 'heavy', not a number"),
        ("load=-0.5", "scorer 'load' has weight '-0.5': a finite number >= 0"),
        ("load=nan", "scorer 'load' has weight 'nan': a finite number >= 0"),
        ("prefix=1,prefix=2", "scorer 'prefix' is named twice"),
        ("prefix", "'prefix' is not name=weight"),
        ("prefix=1,", "'' is not name=weight"),
        ("", "'' is not name=weight"),
    ],
)
def test_a_bad_profile_is_refused_naming_what_is_wrong(profile: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        RoutingParams.from_settings(Settings(routing_profile=profile))
    assert message in str(refused.value) and "LANEWAY_ROUTING_PROFILE" in str(refused.value)
    assert message in (preflight(Settings(routing_profile=profile)) or "")  # `laneway serve` says it in one line


def test_the_per_weight_variables_it_replaced_are_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="LANEWAY_ROUTING_LOAD_WEIGHT is no longer read: set LANEWAY_ROUTING_PROFILE"):
        Settings.from_env({"LANEWAY_ROUTING_LOAD_WEIGHT": "0.25"})


def test_a_name_is_registered_once() -> None:
    register_scorer("prefix", PrefixScorer)  # the same again (a module imported twice): fine
    with pytest.raises(ValueError, match="a scorer named 'prefix' is already registered"):
        register_scorer("prefix", Favourite)
    with pytest.raises(ValueError, match="a word usable in LANEWAY_ROUTING_PROFILE"):
        register_scorer("two words", Favourite)
