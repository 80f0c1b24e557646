"""An answer survives its replica (issue 39): a sim replica that dies or stalls mid-answer is
replaced by another that continues the answer, so the consumer gets the unbroken answer word
for word (the sim continues faithfully), one finish_reason, max_tokens across the seam, a stop
string split across the seam still stopping, and a usage row that bills what was sent once and
records the continuation's prefill as laneway's own. A consumer that leaves is not a failure."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import CLIENT_CLOSED, Gateway, GatewayConfig, GenerationIntent
from laneway.core.policy import PolicyStore
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics as Metrics
from laneway.types import Delta, DeploymentSpec, TenantSnapshot
from laneway.usage import UsageRecorder
from support import until, usage_rows
from support.pipeline import run_collected
from support.specs import sim_replica

TENANT = TenantSnapshot(id=1, name="acme", api_key_id=11)
DIES_AFTER = 6


def spec(i: int, **config: object) -> DeploymentSpec:
    return sim_replica(
        i, max_model_len=4096, **{"decode_ms_base": 1.0, "prefill_ms_per_token": 0.0, "max_concurrency": 2, **config}
    )


@contextlib.asynccontextmanager
async def gateway(
    first: dict[str, Any],
    *,
    max_tries: int = 2,
    replicas: int = 2,
    continuation: bool = True,
    stall_floor_s: float = 5.0,
    retry_minimum: int = 3,
) -> AsyncIterator[Gateway]:
    registry = EngineRegistry()
    await registry.load([spec(0, **first), *(spec(i) for i in range(1, replicas))])
    # Bound at arrival to the replica with the fewest requests, the first listed on a tie: the
    # request goes to the failing m-0 first on purpose.
    gw = Gateway(
        registry,
        PolicyStore(None),
        sinks=[UsageRecorder(None, interval_s=60), Metrics()],  # type: ignore[arg-type]
        config=GatewayConfig(
            routing="least_outstanding",
            max_tries=max_tries,
            continuation=continuation,
            stall_floor_s=stall_floor_s,
            retry_minimum=retry_minimum,
            retry_ratio=0.0,
        ),
    )
    try:
        yield gw
    finally:
        await registry.close()


@pytest.fixture
async def dying() -> AsyncIterator[Gateway]:
    async with gateway({"fail_after_tokens": DIES_AFTER}) as gw:
        yield gw


async def answer(gw: Gateway, *, stream: bool = True, **asked: Any) -> tuple[list[Delta], dict[str, Any]]:
    intent = GenerationIntent(endpoint="completions", alias="m", stream=stream, prompt="tell me", seed=7, **asked)
    call, deltas = await run_collected(gw, TENANT, intent)
    assert [gw.scheduler(d).running_total for d in gw.registry.deployments()] == [0, 0]
    assert [d.engine.active_slots for d in gw.registry.deployments()] == [0, 0]
    return deltas, next(r for r in usage_rows(gw) if r["request_id"] == call.request_id)


def unbroken(gw: Gateway) -> None:
    """From here m-0 no longer dies: the same request's unbroken answer, for comparison."""
    gw.registry.deployments()[0].engine.fail_after_tokens = None  # type: ignore[attr-defined]


def text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_replica_dying_mid_answer_is_continued_word_for_word(dying: Gateway, stream: bool) -> None:
    deltas, row = await answer(dying, stream=stream, max_tokens=20)
    unbroken(dying)
    reference, first_row = await answer(dying, stream=stream, max_tokens=20)
    assert first_row["deployment"] == "m-0" and first_row["continuations"] == 0
    assert text(deltas) == text(reference) and len(text(deltas).split()) == 20  # max_tokens across the seam
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"]
    assert (row["status"], row["deployment"], row["failed_deployments"], row["tries"]) == (200, "m-1", "m-0", 2)
    # Billed once for what the client got; the continuation's prefill (prompt + the answer so
    # far) is laneway's, on its own columns.
    assert (row["completion_tokens"], row["prompt_tokens"]) == (20, first_row["prompt_tokens"])
    assert row["continuations"] == 1
    assert row["continued_prompt_tokens"] == row["prompt_tokens"] + DIES_AFTER
    metrics = next(s for s in dying.sinks if isinstance(s, Metrics))
    assert (
        metrics.registry.get_sample_value("laneway_continuations_total", {"alias": "m", "reason": "engine_error"}) == 1
    )
    assert metrics.registry.get_sample_value("laneway_continuation_seam_seconds_count", {"alias": "m"}) == 1


async def test_a_stop_string_split_across_the_seam_still_stops(dying: Gateway) -> None:
    unbroken(dying)
    reference = text((await answer(dying, max_tokens=20))[0])
    words = reference.split(" ")[1:]  # each token is " word"
    before, after = " ".join(words[:DIES_AFTER]), words[DIES_AFTER]
    stop = before[-2:] + " " + after[:2]  # the end of m-0's last word, the start of m-1's first
    assert reference.count(stop) == 1, "the words chosen do not make a unique stop"
    dying.registry.deployments()[0].engine.fail_after_tokens = DIES_AFTER  # type: ignore[attr-defined]
    deltas, row = await answer(dying, max_tokens=20, stop=[stop])
    assert text(deltas) == reference[: reference.index(stop)]
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["stop"]
    assert row["continuations"] == 1


async def test_a_stalled_replica_is_continued_after_the_inter_token_timeout() -> None:
    async with gateway({"stall_after_tokens": DIES_AFTER, "inter_token_timeout_s": 0.2}) as gw:
        deltas, row = await answer(gw, max_tokens=12)
        gw.registry.deployments()[0].engine.stall_after_tokens = None  # type: ignore[attr-defined]
        reference, _ = await answer(gw, max_tokens=12)
        assert text(deltas) == text(reference)
        assert (row["deployment"], row["continuations"], row["status"]) == ("m-1", 1, 200)
        metrics = next(s for s in gw.sinks if isinstance(s, Metrics))
        labels = {"alias": "m", "reason": "inter_token_timeout"}
        assert metrics.registry.get_sample_value("laneway_continuations_total", labels) == 1


async def test_without_an_inter_token_timeout_a_stall_is_told_from_the_learned_inter_token_time() -> None:
    """No inter_token_timeout_s: once m-0's latency model has learned its decode step, m-0
    frozen mid-answer is caught past 20 x that step (never under the floor, 0.2 s here) and
    the answer continues on m-1, word for word."""
    async with gateway({}, stall_floor_s=0.2) as gw:
        for _ in range(4):  # m-0 learns its step from whole answers
            reference, row = await answer(gw, max_tokens=12)
            assert row["deployment"] == "m-0"
        assert gw.waiting.latency.of("m-0").predict_step(1) is not None
        gw.registry.deployments()[0].engine.stall_after_tokens = DIES_AFTER  # type: ignore[attr-defined]
        deltas, row = await answer(gw, max_tokens=12)
        assert text(deltas) == text(reference)
        assert (row["deployment"], row["continuations"], row["status"]) == ("m-1", 1, 200)
        metrics = next(s for s in gw.sinks if isinstance(s, Metrics))
        labels = {"alias": "m", "reason": "inter_token_timeout"}
        assert metrics.registry.get_sample_value("laneway_continuations_total", labels) == 1


async def test_a_replica_that_is_merely_slow_is_not_taken_for_a_stalled_one() -> None:
    """A replica whose learned step is slow (30 ms a token) is given 20 x that step, far above
    a floor of 10 ms: its answers are not cut."""
    async with gateway({"decode_ms_base": 30.0}, stall_floor_s=0.01) as gw:
        for _ in range(4):
            _, row = await answer(gw, max_tokens=8)
            assert (row["deployment"], row["continuations"]) == ("m-0", 0)
        step = gw.waiting.latency.of("m-0").predict_step(1)
        assert step is not None and step > 0.01
        _, row = await answer(gw, max_tokens=8)
        assert (row["deployment"], row["continuations"], row["tries"]) == ("m-0", 0, 1)


async def test_a_continuation_is_not_charged_to_the_retry_budget() -> None:
    """A replica dying under more streams than the budget allows retries (here: none) still has
    every one continued: each carries on an answer, adding no load (failover.py)."""
    async with gateway({"fail_after_tokens": DIES_AFTER}, retry_minimum=0) as gw:
        for _ in range(3):
            deltas, row = await answer(gw, max_tokens=20)
            assert len(text(deltas).split()) == 20 and (row["status"], row["continuations"]) == (200, 1)


async def test_with_its_tries_spent_a_cut_stream_ends_with_the_error_after_what_was_sent() -> None:
    async with gateway({"fail_after_tokens": DIES_AFTER}, max_tries=1) as gw:
        intent = GenerationIntent(endpoint="completions", alias="m", stream=True, prompt="tell me", max_tokens=20)
        call = await gw.prepare(TENANT, intent)
        lease = await gw.admit(call)
        got: list[Delta] = []
        with pytest.raises(GatewayError) as cut:
            async for d in gw.run(lease):
                got.append(d)
        lease.release()
        assert cut.value.code.value == "engine_error" and "not continued" in str(cut.value)
        assert len(got) == DIES_AFTER and not any(d.finish_reason for d in got)
        row = usage_rows(gw)[-1]
        assert (row["status"], row["continuations"]) == (503, 0)
        await until(lambda: gw.in_flight == 0, what="every lease released")


@pytest.mark.parametrize("stream", [True, False])
async def test_with_continuation_off_a_cut_stream_ends_with_the_error_and_a_whole_answer_starts_again(
    stream: bool,
) -> None:
    """LANEWAY_CONTINUATION=false: the behaviour before continuation (bench/continuation.py's
    baseline): a stream cut mid-answer ends with the error event; a whole answer, of which
    nothing was sent, starts again on the other replica."""
    async with gateway({"fail_after_tokens": DIES_AFTER}, continuation=False) as gw:
        intent = GenerationIntent(endpoint="completions", alias="m", stream=stream, prompt="tell me", max_tokens=20)
        call = await gw.prepare(TENANT, intent)
        lease = await gw.admit(call)
        got: list[Delta] = []
        try:
            if stream:
                with pytest.raises(GatewayError) as cut:
                    async for d in gw.run(lease):
                        got.append(d)
                assert "continuation is off" in str(cut.value) and len(got) == DIES_AFTER
            else:
                got = [d async for d in gw.run(lease)]
                assert len(text(got).split()) == 20
        finally:
            lease.release()
        await until(lambda: gw.in_flight == 0, what="every lease released")
        row = usage_rows(gw)[-1]
        assert row["continuations"] == 0
        assert (row["status"], row["deployment"]) == ((503, "m-0") if stream else (200, "m-1"))


async def test_a_consumer_that_leaves_mid_answer_is_not_a_replica_failure() -> None:
    async with gateway({}) as gw:
        intent = GenerationIntent(endpoint="completions", alias="m", stream=True, prompt="tell me", max_tokens=200)
        call = await gw.prepare(TENANT, intent)
        lease = await gw.admit(call)
        run = gw.run(lease)
        for _ in range(3):
            await anext(run)
        await run.aclose()  # the client left
        lease.release()
        await until(lambda: gw.in_flight == 0, what="every lease released")
        row = usage_rows(gw)[-1]
        assert (row["status"], row["continuations"], row["tries"], row["failed_deployments"]) == (
            CLIENT_CLOSED,
            0,
            1,
            None,
        )
        assert [d.engine.active_slots for d in gw.registry.deployments()] == [0, 0]
