"""The route tester's planner decides with the pipeline's own code and records nothing: the
picker's dry run chooses as a real pick would without touching the prefix index, sessions or
figures, and a planned request takes no slot, no queue place and no rate limit."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Gateway, GenerationIntent
from laneway.core.policy import LanePolicy, PolicySnapshot, PolicyStore, TaskPolicy
from laneway.engines.registry import EngineRegistry
from laneway.runtime.route_preview import RoutePlanner
from laneway.types import ChatTurn, DeploymentSpec, TenantSnapshot
from support.specs import sim_replica

ACME = TenantSnapshot(id=1, name="acme", api_key_id=11)
SYSTEM = "You are a careful assistant for the billing team. " * 40  # several prefix blocks
POLICIES = PolicySnapshot(
    lanes=(LanePolicy("interactive", match_stream=True, match_max_prompt_tokens=500), LanePolicy("standard")),
    tasks={
        "chat": TaskPolicy("chat", max_tokens=300, long_prompt_tokens=100, long_prompt_max_tokens=50, stop=("###",))
    },
)


def spec(i: int) -> DeploymentSpec:
    return sim_replica(i, decode_ms_base=1.0, max_concurrency=2)


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1)])
    yield Gateway(registry, PolicyStore(None, POLICIES))
    await registry.close()


def body(content: str, **extra: object) -> bytes:
    return msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": content}], **extra})


async def test_a_plan_matches_what_serving_the_same_request_decides(gateway: Gateway) -> None:
    plan = RoutePlanner(gateway)
    for content, stream, asked in (("hi", True, None), ("word " * 400, False, 200), (SYSTEM, False, 1000)):
        planned = (await plan(ACME, "chat", body(content, stream=stream, max_tokens=asked), {})).call
        real = await gateway.prepare(
            ACME,
            GenerationIntent(
                endpoint="chat", alias="m", stream=stream, task="chat", messages=[_turn(content)], max_tokens=asked
            ),
        )
        assert (planned.lane.name, planned.generation.max_tokens, planned.generation.stop) == (
            real.lane.name,
            real.generation.max_tokens,
            real.generation.stop,
        )
    assert planned.lane.name == "standard" and planned.generation.max_tokens == 50  # a long prompt's cap
    assert gateway.in_flight == 0 and all(d.outstanding == 0 for d in gateway.registry.deployments())


async def test_the_picker_dry_run_chooses_as_dispatch_would_and_records_nothing(gateway: Gateway) -> None:
    plan = RoutePlanner(gateway)
    picker = gateway.waiting.dispatch.picker
    first = await plan(ACME, "chat", body(SYSTEM + "Q1"), {"X-Laneway-Task": "chat"})
    assert first.pick is not None and sorted(d.spec.name for d in first.replicas) == ["m-0", "m-1"]
    assert picker.figures == {} and all(picker.index.size(d.spec.name) == 0 for d in first.replicas)
    # Served for real, the request lands where the dry run said; then the plan sees its prefix there.
    call = await gateway.prepare(
        ACME,
        GenerationIntent(
            endpoint="chat", alias="m", stream=False, task="chat", messages=[_turn(SYSTEM + "Q1")], max_tokens=2
        ),
    )
    lease = await gateway.admit(call)
    async for _ in gateway.run(lease):
        pass
    lease.release()
    assert call.deployment is first.pick.replica
    again = await plan(ACME, "chat", body(SYSTEM + "Q2"), {})
    assert again.pick is not None and again.pick.replica is first.pick.replica and again.pick.reason == "prefix"
    assert picker.figures[call.deployment.spec.name].placed == 1  # the real one only


async def test_a_request_laneway_would_refuse_is_refused_in_the_apis_words(gateway: Gateway) -> None:
    plan = RoutePlanner(gateway)
    with pytest.raises(GatewayError) as refused:
        await plan(ACME, "chat", b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temprature": 1}', {})
    assert refused.value.code.value == "unknown_parameter" and refused.value.param == "temprature"
    with pytest.raises(GatewayError) as refused:
        await plan(ACME, "chat", body("x", model="nope"), {})
    assert refused.value.code.value == "model_not_found"
    with pytest.raises(GatewayError) as refused:
        await plan(ACME, "chat", body("x"), {"X-Laneway-Lane": "standard"})  # acme may not name a lane
    assert refused.value.code.value == "lane_not_allowed"


def _turn(content: str) -> ChatTurn:
    return ChatTurn(role="user", content=content)


async def test_a_message_is_planned_as_the_messages_api_reads_it(gateway: Gateway) -> None:
    """Anthropic's Messages API in the tester: the same chat plan for the same conversation,
    its own refusals (max_tokens is required there) named as that API names them."""
    plan = RoutePlanner(gateway)
    sent = {"model": "m", "max_tokens": 40, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    message = (await plan(ACME, "messages", msgspec.json.encode(sent), {})).call
    chat_turns = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    chat = (
        await plan(ACME, "chat", msgspec.json.encode({"model": "m", "max_tokens": 40, "messages": chat_turns}), {})
    ).call
    assert (message.lane.name, message.generation.max_tokens, message.prompt_tokens) == (
        chat.lane.name,
        chat.generation.max_tokens,
        chat.prompt_tokens,
    )
    with pytest.raises(GatewayError) as refused:
        await plan(ACME, "messages", body("x"), {})  # no max_tokens
    assert refused.value.param == "max_tokens"
    with pytest.raises(GatewayError) as refused:
        await plan(ACME, "embeddings", body("x"), {})
    assert refused.value.param == "endpoint"
