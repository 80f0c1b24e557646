"""Engine swaps (core/canary/): the canary pool chosen by a stable hash of tenant and session,
its weight honoured within a couple of points, the pool narrowing the replicas every routing
path chooses among; roles that cannot work together refused naming the field; the canary
watch rolling back a canary past its margins and only then; the shadow's copies compared,
dropped when busy, and never touching a live request."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace

import pytest
from laneway.admin.role_checks import Roled, check_roles
from laneway.contracts.errors import GatewayError
from laneway.core.canary.compare import Pair, ShadowFigures, similarity
from laneway.core.canary.pools import choose_pool, session_of, share_of
from laneway.core.canary.watch import CanaryWatch, Margins
from laneway.core.pipeline import Gateway, GatewayConfig, GenerationIntent
from laneway.core.policy import PolicyStore
from laneway.engines.base import EngineError
from laneway.engines.registry import EngineRegistry, in_pool
from laneway.types import ChatTurn, Delta, DeploymentSpec, GenerationRequest, TenantSnapshot
from support.pipeline import run_admitted
from support.specs import sim_replica

ACME = TenantSnapshot(id=1, name="acme", api_key_id=11)


def spec(i: int, role: str = "serving", weight: float = 0.0, sample: float = 0.0) -> DeploymentSpec:
    base = sim_replica(i, decode_ms_base=1.0, max_concurrency=4)
    return replace(base, role=role, weight=weight, sample=sample)


@pytest.fixture
async def registry() -> AsyncIterator[EngineRegistry]:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1, "canary", 10.0)])
    yield registry
    await registry.close()


def chat(user_message: str, *, user: str | None = None, key: str | None = None, turns: int = 1) -> GenerationIntent:
    messages = [ChatTurn("system", "You are helpful."), ChatTurn("user", user_message)]
    for t in range(1, turns):
        messages += [ChatTurn("assistant", f"answer {t}"), ChatTurn("user", f"follow-up {t}")]
    return GenerationIntent(
        endpoint="chat",
        alias="m",
        stream=False,
        messages=messages,
        max_tokens=2,
        user=user,
        prompt_cache_key=key,
        temperature=0.0,
    )


# ---- the pool ----
def test_the_session_is_the_cache_key_then_the_user_then_the_first_user_message() -> None:
    assert session_of(chat("q", user="u", key="k")) == "key\0k"
    assert session_of(chat("q", user="u")) == "user\0u"
    # every turn of a conversation names it alike; the shared system prompt does not
    assert session_of(chat("q1", turns=3)) == session_of(chat("q1")) != session_of(chat("q2"))


async def test_a_canary_takes_its_weight_of_sessions_and_each_session_stays_in_its_pool(
    registry: EngineRegistry,
) -> None:
    replicas = registry.replicas("m")
    pools = [choose_pool(replicas, ACME.id, f"user\0{i}") for i in range(5000)]
    share = pools.count("canary") / len(pools)
    assert 0.08 <= share <= 0.12
    assert all(choose_pool(replicas, ACME.id, f"user\0{i}") == pools[i] for i in range(500))  # stable
    # another tenant's session of the same name is placed independently
    assert share_of(1, "user\0x") != share_of(2, "user\0x")
    replicas[1].healthy = False  # ejected: its sessions go to the serving pool meanwhile
    assert {choose_pool(replicas, ACME.id, f"user\0{i}") for i in range(500)} == {"serving"}
    replicas[1].healthy = True
    replicas[1].weight = 0.0  # rolled back: nothing goes to the canary
    assert {choose_pool(replicas, ACME.id, f"user\0{i}") for i in range(500)} == {"serving"}


async def test_the_pool_narrows_the_replicas_and_a_shadow_serves_no_client(registry: EngineRegistry) -> None:
    serving, canary = registry.replicas("m")
    assert in_pool([serving, canary], "canary") == [canary]
    assert in_pool([serving, canary], "serving") == [serving]
    assert in_pool([serving], "canary") == [serving]  # the canary failed or is excluded: the other pool
    canary.role = "shadow"
    assert in_pool([serving, canary], "canary") == [serving]
    assert {registry.resolve("m").spec.name for _ in range(4)} == {"m-0"}


@pytest.mark.parametrize("routing", ["cache_aware", "least_outstanding"])
async def test_requests_go_to_their_pool_and_a_conversation_stays_on_one_engine(
    registry: EngineRegistry, routing: str
) -> None:
    registry.replicas("m")[1].weight = 50.0
    gw = Gateway(registry, PolicyStore(None), config=GatewayConfig(routing=routing))
    served: dict[str, set[str]] = {}
    for i in range(12):
        for turns in (1, 2, 3):
            call = await gw.prepare(ACME, chat(f"conversation {i}", turns=turns))
            await run_admitted(gw, call)
            assert call.deployment.spec.name == ("m-1" if call.pool == "canary" else "m-0")
            served.setdefault(str(i), set()).add(call.deployment.spec.name)
    assert all(len(engines) == 1 for engines in served.values())
    assert {e for engines in served.values() for e in engines} == {"m-0", "m-1"}


async def test_a_sync_applies_roles_in_place_without_restarting_an_engine(registry: EngineRegistry) -> None:
    before = {d.spec.name: d.engine for d in registry.deployments()}
    assert await registry.sync([spec(0), spec(1, "shadow", sample=25.0)]) == []
    d = registry.replicas("m")[1]
    assert (d.role, d.weight, d.sample, d.engine) == ("shadow", 0.0, 25.0, before["m-1"])


# ---- the roles' checks ----
def roled(name: str, role: str = "serving", weight: float = 0.0, sample: float = 0.0) -> Roled:
    return Roled(name, role, weight, sample)


@pytest.mark.parametrize(
    ("rows", "param"),
    [
        ([roled("a"), roled("b", "canary", 101.0)], "deployments[1].weight"),
        ([roled("a"), roled("b", "canary", -1.0)], "deployments[1].weight"),
        ([roled("a"), roled("b", "canary", math.nan)], "deployments[1].weight"),
        ([roled("a"), roled("b", "shadow", sample=math.inf)], "deployments[1].sample"),
        ([roled("a"), roled("b", "shadow", sample=5), roled("c", "shadow", sample=5)], "deployments[2].role"),
        ([roled("b", "canary", 10.0)], "deployments[0].role"),  # a canary on an alias with one deployment
        ([roled("a"), roled("b", "canary", 60.0), roled("c", "canary", 50.0)], "deployments[2].weight"),
        ([roled("a"), roled("b", "blue")], "deployments[1].role"),
    ],
)
def test_roles_that_cannot_work_are_refused_naming_the_field(rows: list[Roled], param: str) -> None:
    with pytest.raises(GatewayError) as refused:
        check_roles(rows, lambda i, field: f"deployments[{i}].{field}")
    assert refused.value.status == 400 and refused.value.param == param


def test_a_canary_and_a_shadow_beside_a_serving_deployment_are_fine() -> None:
    check_roles([roled("a"), roled("b", "canary", 10.0), roled("c", "shadow", sample=25.0)], lambda i, f: f)


# ---- the canary watch ----
@dataclass(frozen=True)
class Tried:
    deployment: str
    reason: str


@dataclass(frozen=True)
class Finished:
    deployment: str
    status: int = 200
    ttft_ms: float | None = 10.0
    failed_tries: tuple[Tried, ...] = ()
    model: str = "m"
    error_code: str | None = None
    completion_tokens: int = 2
    cost_micros: int | None = None


async def test_a_canary_erring_past_its_margin_is_rolled_back_once_it_has_enough_requests(
    registry: EngineRegistry,
) -> None:
    rolled: list[tuple[str, str, str]] = []
    watch = CanaryWatch(registry, Margins(error_margin=0.05, min_requests=9))
    watch.on_rollback = lambda *a: rolled.append(a)
    for _ in range(20):
        watch.finished(Finished("m-0"))
    for i in range(8):  # a third of its requests fail over to the serving pool: the client saw none
        failed = (Tried("m-1", "engine_error"),) if i % 3 == 0 else ()
        watch.finished(Finished("m-0" if failed else "m-1", failed_tries=failed))
    assert rolled == [] and registry.replicas("m")[1].weight == 10.0  # 8 < min_requests
    watch.finished(Finished("m-0", failed_tries=(Tried("m-1", "engine_error"),)))
    assert rolled == [("m", "m-1", "error_rate")] and registry.replicas("m")[1].weight == 0.0
    assert watch.rollbacks[("m", "m-1", "error_rate")] == 1


async def test_a_canary_within_its_margins_stays_and_a_slow_one_is_rolled_back(registry: EngineRegistry) -> None:
    watch = CanaryWatch(registry, Margins(ttft_margin=0.5, min_requests=10))
    for _ in range(30):
        watch.finished(Finished("m-0", ttft_ms=100.0))
        watch.finished(Finished("m-1", ttft_ms=140.0))  # 40 % slower: within the margin
    assert registry.replicas("m")[1].weight == 10.0
    for _ in range(3):
        watch.finished(Finished("m-1", ttft_ms=400.0))  # its p99 now 4x the serving pool's
    assert registry.replicas("m")[1].weight == 0.0
    assert watch.rollbacks[("m", "m-1", "ttft_p99")] == 1


async def test_client_refusals_are_no_ones_error(registry: EngineRegistry) -> None:
    watch = CanaryWatch(registry, Margins(min_requests=5))
    for _ in range(10):
        watch.finished(Finished("m-0"))
        watch.finished(Finished("m-1", status=499, ttft_ms=None))
        watch.finished(Finished("m-1", status=429, ttft_ms=None))
    assert registry.replicas("m")[1].weight == 10.0
    assert watch.figures(registry.replicas("m"))["m-1"]["requests"] == 0


# ---- the shadow ----
def test_answers_are_compared_by_exact_match_similarity_and_json() -> None:
    assert similarity("a b c", "a b c") == 1.0 and similarity("a b", "c d") == 0.0
    assert similarity("a b c d", "a b c e") == pytest.approx(3 / 5)
    figures = ShadowFigures()
    figures.add(Pair('{"a": 1}', '{"a": 1}', 0.1, 0.2, greedy=True, json_mode=True, prompt_head="p"))
    figures.add(Pair('{"a": 1}', '{"a": 1', 0.1, 0.2, greedy=True, json_mode=True, prompt_head="q"))
    figures.add(Pair("x", "y", None, None, greedy=False, json_mode=False, prompt_head="r"))
    report = figures.report()
    assert report["compared"] == 3 and report["greedy"] == 2 and report["exact_match_rate"] == 0.5
    assert report["json_valid_served"] == 1.0 and report["json_valid_shadow"] == 0.5
    assert report["ttft_p50_ratio"] == pytest.approx(2.0) and report["worst"][0]["prompt"] == "q"


async def serve_one(gw: Gateway, message: str) -> tuple[str, str]:
    call = await gw.prepare(ACME, chat(message))
    lease = await gw.admit(call)
    try:
        text = "".join([d.text async for d in gw.run(lease)])
    finally:
        lease.release()
    return call.deployment.spec.name, text


async def settle(gw: Gateway) -> None:
    for _ in range(200):
        if not gw.swaps.shadows._tasks:
            return
        await asyncio.sleep(0.01)


async def test_sampled_copies_run_on_the_shadow_and_agree_with_the_served_answers() -> None:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1, "shadow", sample=100.0)])
    gw = Gateway(registry, PolicyStore(None))
    try:
        for i in range(5):
            assert (await serve_one(gw, f"question {i}"))[0] == "m-0"  # never the shadow
        await settle(gw)
        report = gw.swaps.compare("m")["shadow"]
        assert report["compared"] == 5 and report["exact_match_rate"] == 1.0 and report["ttft_samples"] == 5
        assert gw.swaps.watch.figures(registry.replicas("m"))["m-1"]["requests"] == 0  # copies are no one's traffic
        assert registry.replicas("m")[1].outstanding == 0
    finally:
        await gw.drain(1.0)
        await registry.close()


async def test_a_failing_shadow_never_touches_a_live_request_and_a_busy_one_drops_copies() -> None:
    registry = EngineRegistry()
    await registry.load([spec(0), spec(1, "shadow", sample=100.0)])
    shadow = registry.replicas("m")[1]

    async def failing(request: GenerationRequest) -> AsyncGenerator[Delta, None]:
        raise EngineError("the shadow is down")
        yield Delta("")  # pragma: no cover - makes this a generator

    shadow.engine.generate = failing  # type: ignore[method-assign]
    gw = Gateway(registry, PolicyStore(None))
    gw.swaps.shadows.concurrency = 1
    try:
        served = await asyncio.gather(*(serve_one(gw, f"q {i}") for i in range(6)))
        assert all(name == "m-0" and text for name, text in served)
        await settle(gw)
        figures = gw.swaps.shadows.figures["m-1"]
        assert figures.failed >= 1 and figures.compared == 0 and figures.failed + figures.dropped == 6
        assert shadow.outstanding == 0
    finally:
        await gw.drain(1.0)
        await registry.close()
