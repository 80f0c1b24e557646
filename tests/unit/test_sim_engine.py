import asyncio

import pytest
from laneway.engines.sim import SimEngine
from laneway.types import GenerationRequest
from support import until


def req(i: int, *, max_tokens: int = 5, prompt_tokens: int = 10, seed: int | None = 1) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"r{i}",
        prompt="p" * prompt_tokens * 4,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        seed=seed,
    )


@pytest.fixture
async def sim() -> SimEngine:
    engine = SimEngine("sim", {"max_concurrency": 2, "decode_ms_base": 1.0, "prefill_ms_per_token": 0.0})
    await engine.start()
    yield engine  # type: ignore[misc]
    await engine.close()


async def collect(engine: SimEngine, r: GenerationRequest) -> tuple[str, int, str | None]:
    text, tokens, finish = "", 0, None
    async for d in engine.generate(r):
        text, tokens, finish = text + d.text, tokens + d.tokens, d.finish_reason
    return text, tokens, finish


async def test_output_is_deterministic_for_a_seed_and_exactly_max_tokens_long(sim: SimEngine) -> None:
    a, b = await asyncio.gather(collect(sim, req(1)), collect(sim, req(2)))
    assert a == b
    assert a[1] == 5 and a[2] == "length"
    assert a != await collect(sim, req(3, seed=2))


async def test_tokenizer_counts_one_token_per_four_characters() -> None:
    engine = SimEngine("sim", {})
    assert (await engine.measure(prompt="x" * 16000)).tokens == 4000
    assert (await engine.measure(prompt="")).tokens == 1


async def test_concurrency_is_capped_and_the_rest_wait_inside_the_engine(sim: SimEngine) -> None:
    seen_running: list[int] = []

    async def run(i: int) -> None:
        async for _ in sim.generate(req(i, max_tokens=20)):
            seen_running.append(sim.active_slots)

    await asyncio.gather(*(run(i) for i in range(5)))
    assert max(seen_running) == 2
    assert sim.active_slots == 0 and sim.waiting == 0


async def test_closing_the_stream_frees_the_slot_at_once(sim: SimEngine) -> None:
    stream = sim.generate(req(1, max_tokens=10_000))
    await anext(stream)
    assert sim.active_slots == 1
    await stream.aclose()
    assert sim.active_slots == 0


async def test_a_waiting_request_that_is_cancelled_never_runs(sim: SimEngine) -> None:
    hogs = [sim.generate(req(i, max_tokens=10_000)) for i in range(2)]
    for h in hogs:
        await anext(h)
    queued = sim.generate(req(9))
    task = asyncio.create_task(anext(queued))
    await until(lambda: sim.waiting == 1, what="the request queued")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await queued.aclose()
    assert sim.waiting == 0
    for h in hogs:
        await h.aclose()


async def test_step_time_grows_with_prefill_and_batch_size() -> None:
    engine = SimEngine("sim", {"prefill_ms_per_token": 1.0, "decode_ms_base": 0.0, "decode_ms_per_seq": 0.0})
    await engine.start()
    loop = asyncio.get_running_loop()
    try:
        t0 = loop.time()
        await collect(engine, req(1, max_tokens=1, prompt_tokens=50))
        assert loop.time() - t0 >= 0.05  # 50 prompt tokens x 1 ms prefill
    finally:
        await engine.close()


async def test_fault_marker_fails_only_that_request(sim: SimEngine) -> None:
    from laneway.engines.base import EngineError

    bad = GenerationRequest(request_id="bad", prompt="x <<laneway-sim-fault>>", prompt_tokens=5, max_tokens=10)
    got: list[str] = []

    async def run_bad() -> None:
        async for d in sim.generate(bad):
            got.append(d.text)

    results = await asyncio.gather(run_bad(), collect(sim, req(1, max_tokens=10)), return_exceptions=True)
    assert isinstance(results[0], EngineError) and len(got) == 2
    assert results[1][1] == 10  # the neighbour finished normally
    assert sim.active_slots == 0
