import asyncio
from pathlib import Path

import pytest
from laneway.engines.base import EngineError
from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN
from laneway.engines.llamacpp import LlamaCppEngine
from laneway.types import ChatTurn, GenerationRequest
from support import until


@pytest.fixture
async def llama(demo_model_path: Path) -> LlamaCppEngine:
    engine = LlamaCppEngine(
        "tiny",
        {"model_path": str(demo_model_path), "parallel": 2, "demo": True, "ban_tokens": [EOS_TOKEN, IM_END_TOKEN]},
        max_model_len=512,
    )
    await engine.start()
    yield engine  # type: ignore[misc]
    await engine.close()


async def req(
    engine: LlamaCppEngine, prompt: str = "hello world", *, max_tokens: int = 16, seed: int | None = 7
) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        prompt=prompt,
        prompt_tokens=(await engine.measure(prompt=prompt)).tokens,
        max_tokens=max_tokens,
        seed=seed,
        temperature=0.8,
    )


async def wait_idle(engine: LlamaCppEngine) -> None:
    await until(lambda: not engine.active_slots, within=2, step=0.001, what="every slot free")


async def collect(engine: LlamaCppEngine, r: GenerationRequest) -> tuple[str, int, str | None]:
    text, tokens, finish = "", 0, None
    async for d in engine.generate(r):
        text, tokens, finish = text + d.text, tokens + d.tokens, d.finish_reason
    return text, tokens, finish


async def test_generates_exactly_max_tokens_when_end_tokens_are_banned(llama: LlamaCppEngine) -> None:
    text, tokens, finish = await collect(llama, await req(llama, max_tokens=16))
    assert tokens == 16 and finish == "length" and text


async def test_same_seed_same_text_and_output_is_valid_utf8(llama: LlamaCppEngine) -> None:
    a, b = await asyncio.gather(collect(llama, await req(llama)), collect(llama, await req(llama)))
    assert a == b
    assert "\ufffd" not in a[0]  # the demo bias bans lone high bytes


async def test_measure_renders_chatml_and_counts_markers_as_single_tokens(llama: LlamaCppEngine) -> None:
    m = await llama.measure(messages=[ChatTurn("user", "hello")])
    assert m.text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    # BOS + <|im_start|> + "user" pieces ... far fewer tokens than characters
    assert 5 < m.tokens < len(m.text) // 2


async def test_closing_the_stream_stops_decoding_and_frees_the_slot(llama: LlamaCppEngine) -> None:
    stream = llama.generate(await req(llama, max_tokens=400))
    await anext(stream)
    assert llama.active_slots == 1
    await stream.aclose()
    await wait_idle(llama)
    # The freed context serves the next request normally.
    assert (await collect(llama, await req(llama, max_tokens=3)))[1] == 3


async def test_parallel_slots_serve_concurrent_requests(llama: LlamaCppEngine) -> None:
    peak = 0

    async def run() -> None:
        nonlocal peak
        async for _ in llama.generate(await req(llama, max_tokens=64)):
            peak = max(peak, llama.active_slots)
            await asyncio.sleep(0)

    await asyncio.gather(*(run() for _ in range(4)))
    assert peak == 2
    await wait_idle(llama)  # the last decode thread hands its slot back a moment after its final token


async def test_missing_model_file_is_a_clear_engine_error(tmp_path: Path) -> None:
    engine = LlamaCppEngine("x", {"model_path": str(tmp_path / "nope.gguf")})
    with pytest.raises(EngineError, match="not found"):
        await engine.start()


async def test_a_long_prompt_is_measured_off_the_event_loop(llama: LlamaCppEngine) -> None:
    """A 16 KB prompt's tokenizing takes milliseconds: not on the loop every request shares."""
    ctx = llama._contexts[0]
    seen: list[bool] = []
    tokenize = ctx.tokenize

    def watched(*args: object, **kwargs: object) -> list[int]:
        try:
            asyncio.get_running_loop()
            seen.append(True)  # called from the loop's thread
        except RuntimeError:
            seen.append(False)
        return tokenize(*args, **kwargs)  # type: ignore[no-any-return,arg-type]

    ctx.tokenize = watched  # type: ignore[method-assign]
    long = "lorem ipsum dolor sit amet " * 600
    short = await llama.measure(prompt="hello world")
    measured = await llama.measure(messages=[ChatTurn(role="user", content=long)])
    assert seen == [True, False]  # the short one inline (a thread hop costs more), the long one not
    ctx.tokenize = tokenize  # type: ignore[method-assign]
    assert short.tokens > 0 and measured.tokens > 10_000  # counted all the same


async def test_n_gpu_layers_reaches_llama_cpp_and_a_cpu_build_still_serves(demo_model_path: Path) -> None:
    config = {"model_path": str(demo_model_path), "parallel": 1, "demo": True, "n_gpu_layers": -1}
    engine = LlamaCppEngine("tiny", config, max_model_len=256, gpu_type="L4")
    await engine.start()
    try:
        # -1 is "every layer", which llama-cpp-python passes on as INT32_MAX
        assert engine._contexts[0].model_params.n_gpu_layers == 2**31 - 1
        assert engine.info.gpu_type == "L4"  # as the deployment row says
        _, tokens, _ = await collect(engine, await req(engine, max_tokens=3))
        assert tokens == 3  # no GPU here: llama.cpp runs every layer on the CPU
    finally:
        await engine.close()
