"""The per-request and per-token shortcuts of the stream's hot path give what the long way gave
(bench/results/2026-12-07-overhead-streams.md): the fits' written-out solve, the deferred
outlook, the engine capability kept per object, the spliced text frames and vLLM's stream
read without a generator of its own."""

from __future__ import annotations

import random
from types import SimpleNamespace

import msgspec
import pytest
from laneway.api import protocol as p
from laneway.api.sse import event
from laneway.api.stream import TextFrames
from laneway.core.latency.fit import _solve, _solve_normal
from laneway.core.latency.outlook import Outlook, ReplicaState
from laneway.core.latency.replica import ReplicaLatencyModel
from laneway.engines.base import EngineError, EngineLoad, load_reporter, prefix_tracker
from laneway.engines.vllm.answers import StreamReader


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_the_written_out_solve_gives_the_elimination_s_coefficients(size: int) -> None:
    rng = random.Random(size)
    for _ in range(50):
        rows = [(1.0, *(rng.uniform(0, 500) for _ in range(size - 1))) for _ in range(rng.randint(1, 30))]
        a = [[sum(r[i] * r[j] for r in rows) for j in range(size)] for i in range(size)]
        for i in range(1, size):
            a[i][i] += 1e-4 * len(rows)  # the fit's ridge
        b = [sum(r[i] * rng.uniform(0.01, 1.0) for r in rows) for i in range(size)]
        kept = [row[:] for row in a]
        got = _solve_normal(a, b)
        assert a == kept  # the fit's sums are not consumed
        want = _solve([row[:] for row in a], b)
        assert got is not None and want is not None
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9)


def test_a_singular_system_is_still_none() -> None:
    assert _solve_normal([[0.0]], [1.0]) is None
    assert _solve_normal([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [1.0, 1.0, 1.0]) is None


def _warm_model() -> ReplicaLatencyModel:
    model = ReplicaLatencyModel()
    now = 100.0
    for k in range(6):
        attempt = model.begin(now, 40 + k, 0, None)
        attempt.first_token(now + 0.05)
        attempt.end(40 + k, 16, True, now + 0.2)
        now += 0.3
    return model


def test_a_deferred_outlook_is_none_while_cold_and_prices_as_the_eager_one_once_warm() -> None:
    cold = ReplicaLatencyModel()
    assert Outlook.deferred([ReplicaState(cold, 1, 4)], 100) is None
    assert Outlook.of([ReplicaState(cold, 1, 4)], 100) is None
    model = _warm_model()
    assert model.predicts
    states = [ReplicaState(model, 6, 4), ReplicaState(model, 2, 4)]
    eager, deferred = Outlook.of(states, 100), Outlook.deferred(states, 100)
    assert eager is not None and deferred is not None
    assert deferred.free == eager.free
    assert deferred.seconds_for(3) == pytest.approx(eager.seconds_for(3))
    assert deferred.ttft(5) == pytest.approx(eager.ttft(5))


class _Reporting:
    def reported_load(self) -> EngineLoad | None:
        return EngineLoad(running=1, waiting=0, kv_usage=0.0)


class _Silent:
    pass


def test_an_engine_s_capabilities_are_the_protocol_s_answer_kept_per_object() -> None:
    reporting, silent = _Reporting(), _Silent()
    for _ in range(2):  # asked, then kept
        assert load_reporter(reporting) is reporting
        assert load_reporter(silent) is None
        assert prefix_tracker(reporting) is None
    # An object without weak references (a test's stand-in) is asked each time.
    stand_in = SimpleNamespace(reported_load=lambda: None)
    assert load_reporter(stand_in) is stand_in
    assert load_reporter(SimpleNamespace()) is None


@pytest.mark.parametrize("text", ["hi", ' wo"rd\\', "é中😀", "\x00", "</script>", "\u2028", ""])
def test_a_spliced_text_frame_is_the_whole_chunk_s_bytes(text: str) -> None:
    def chat(i: int, t: str) -> bytes:
        choice = p.ChunkChoice(index=i, delta=p.ChunkDelta(content=t))
        return event(p.ChatCompletionChunk(id="chatcmpl-1", created=1, model="m", choices=[choice]))

    def completion(i: int, t: str) -> bytes:
        choice = p.CompletionChoice(index=i, text=t, finish_reason=None)
        return event(p.Completion(id="cmpl-1", created=1, model="m", choices=[choice], system_fingerprint="fp"))

    for make in (chat, completion):
        frames = TextFrames(make)
        for index in (0, 2, 0):
            assert frames(index, text) == make(index, text)


def test_an_id_holding_the_marker_is_not_spliced() -> None:
    def make(i: int, t: str) -> bytes:
        choice = p.CompletionChoice(index=i, text=t, finish_reason=None)
        return event(p.Completion(id="\x00laneway-text\x00", created=1, model="m", choices=[choice]))

    assert TextFrames(make)(0, "x") == make(0, "x")


def _sse(*chunks: dict[str, object]) -> bytes:
    return b"".join(b"data: " + msgspec.json.encode(c) + b"\n\n" for c in chunks)


def test_vllm_s_stream_read_in_pieces_gives_each_token_and_the_usage_s_count() -> None:
    body = (
        _sse(
            {"choices": [{"index": 0, "text": "Hel"}]},
            {"choices": [{"index": 0, "text": "lo"}]},
            {"choices": [{"index": 0, "text": "!", "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}},
        )
        + b"data: [DONE]\n\n"
    )
    reader = StreamReader()
    deltas = []
    for k in range(0, len(body), 5):  # lines split across reads
        deltas += reader.feed(body[k : k + 5])
    assert reader.done and reader.error is None
    assert "".join(d.text for d in deltas) == "Hello!"
    last = reader.end(1)
    assert [(d.finish_reason, d.tokens, d.prompt_tokens) for d in last] == [("stop", 1, 7)]


def test_an_error_chunk_comes_after_the_deltas_before_it_in_the_same_read() -> None:
    reader = StreamReader()
    deltas = reader.feed(_sse({"choices": [{"index": 0, "text": "a"}]}, {"error": "boom"}))
    assert [d.text for d in deltas] == ["a"]
    assert isinstance(reader.error, EngineError)


def test_a_stream_cut_before_its_end_is_an_engine_error() -> None:
    reader = StreamReader()
    reader.feed(_sse({"choices": [{"index": 0, "text": "a"}]}))
    with pytest.raises(EngineError):
        reader.end(1)
