"""Early stops (core/early_stops.py): the rules on text, and the pipeline that cuts a looping
or finished JSON answer, cancels the engine at once and counts what that saved."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from laneway.core.early_stops import (
    JSON_COMPLETE,
    REPETITION,
    EarlyStop,
    EarlyStopRule,
    JsonEnd,
    RepetitionStop,
    rule_for,
)
from laneway.core.pipeline import Gateway, GatewayConfig, GenerationIntent
from laneway.core.policy import PolicySnapshot, PolicyStore, TaskPolicy
from laneway.db.repositories import DeploymentSpec
from laneway.engines.kinds import EngineKind
from laneway.engines.registry import EngineRegistry
from laneway.metrics import GatewayMetrics
from laneway.types import GenerationRequest, SamplingExtensions, TenantSnapshot
from laneway.usage import UsageRecorder
from prometheus_client.parser import text_string_to_metric_families
from standins.looping_engine import LOOPING, LoopingEngine
from support import usage_rows

TENANT = TenantSnapshot(id=1, name="acme", api_key_id=11)


def cut_text(rule: EarlyStop, chunks: list[str]) -> str | None:
    """The text a client gets up to the cut, or None when the rule never fires."""
    out = ""
    for chunk in chunks:
        at = rule.feed(chunk)
        if at is not None:
            return out + chunk[:at]
        out += chunk
    return None


def random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 40))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


# ---- the rules on text ----


def test_a_word_loop_is_cut_at_the_unit_that_repeats_the_ngram_for_the_count_th_time() -> None:
    # 2-grams: "the the" is seen at the 2nd, 3rd, 4th "the": the 3rd sighting is the 4th word.
    assert cut_text(RepetitionStop(2, 3), ["Then", " the", " the", " the", " the", " the"]) == "Then the the the the"


def test_a_repeated_sentence_is_cut_in_its_third_copy() -> None:
    line = "A realm where the sea is a place of endless blue,\n"
    text = "The waves of the ocean,\n" + line * 10
    cut = cut_text(RepetitionStop(6, 3), [text])
    assert cut is not None and text.startswith(cut)
    assert cut.count(line) == 2 and len(cut) < len(line) * 3 + 30


def test_text_without_a_loop_is_never_cut() -> None:
    text = "The capital of France is Paris. It is a city of art, food and history, on the Seine."
    assert cut_text(RepetitionStop(4, 2), [text]) is None


def test_the_cut_does_not_depend_on_how_the_text_is_split_into_deltas() -> None:
    rng = random.Random(7)
    text = "Tips: sleep well. " + "7. Avoid watching TV close to bedtime\n" * 8
    whole = cut_text(RepetitionStop(6, 3), [text])
    assert whole is not None
    for _ in range(200):
        assert cut_text(RepetitionStop(6, 3), random_chunks(text, rng)) == whole


def test_a_word_split_across_deltas_is_one_word() -> None:
    # "bed"+"time" is one unit: three "bedtime"s, not "bed", "time" pairs.
    assert cut_text(RepetitionStop(1, 3), ["bed", "time bed", "time bed", "time!"]) == "bedtime bedtime bedtime"
    # A word that ended a delta ends where the next one starts with a space: cut there.
    assert cut_text(RepetitionStop(1, 2), ["go", " go", " on"]) == "go go"


def test_punctuation_marks_are_units_so_a_punctuation_loop_is_cut() -> None:
    assert cut_text(RepetitionStop(3, 3), ["Wow", "!!", "!!!", "!!!!!!"]) == "Wow!!!!!"


def test_json_end_cuts_right_after_the_top_level_value() -> None:
    text = '  {"a": "}]\\" {", "b": [1, {"c": []}]}\n\n\nAnd some more text {'
    assert cut_text(JsonEnd(), [text]) == text[: text.index("\n")]
    assert cut_text(JsonEnd(), ["[1, 2", "]", " trailing"]) == "[1, 2]"


def test_json_end_finds_the_same_end_whatever_the_deltas() -> None:
    rng = random.Random(3)
    value = {"name": 'Al "the" {brace}', "list": [1, [2, [3]], {"x": "\\"}], "e": ""}
    text = json.dumps(value) + "\n   garbage"
    for _ in range(200):
        cut = cut_text(JsonEnd(), random_chunks(text, rng))
        assert cut is not None and json.loads(cut) == value
    # An escape that ends a delta: the next delta's first character is escaped.
    assert cut_text(JsonEnd(), ['{"a": "\\', '"}', '"}', " x"]) == '{"a": "\\"}"}'


def test_json_end_waits_for_text_after_a_value_that_ends_a_delta() -> None:
    rule = JsonEnd()
    assert rule.feed('{"a": 1}') is None  # the engine may end right here: not cut
    assert rule.feed("\n") == 0  # it did not: cut before what followed


def test_json_end_leaves_alone_an_answer_that_is_not_an_object_or_array() -> None:
    assert cut_text(JsonEnd(), ["Sure! ", '{"a": 1}', " more"]) is None
    assert cut_text(JsonEnd(), ['"a string"', " more"]) is None


def request(**fields: Any) -> GenerationRequest:
    return GenerationRequest(request_id="r", prompt="p", prompt_tokens=1, max_tokens=10, **fields)


def test_the_rule_follows_the_task_policy_the_json_mode_and_the_length_extensions() -> None:
    chat = TaskPolicy("chat", 100, repetition_ngram=6, repetition_count=3)
    assert rule_for(chat, request()) == EarlyStopRule(REPETITION, 6, 3)
    assert rule_for(None, request()) is None  # no task policy: no early stop
    assert rule_for(TaskPolicy("exact", 100), request()) is None  # repetition off
    json_mode = {"type": "json_object"}
    assert rule_for(chat, request(response_format=json_mode)) == EarlyStopRule(JSON_COMPLETE)
    no_json = TaskPolicy("raw", 100, repetition_ngram=6, json_stop=False)
    assert rule_for(no_json, request(response_format={"type": "json_schema", "json_schema": {}})) is None
    # A request that asked for a length gets none: a benchmark's exact lengths.
    assert rule_for(chat, request(extensions=SamplingExtensions(ignore_eos=True))) is None
    assert rule_for(chat, request(extensions=SamplingExtensions(min_tokens=5))) is None
    assert rule_for(chat, request(extensions=SamplingExtensions(ignore_eos=False))) is not None


# ---- the pipeline ----

# 4-grams, 3 sightings: "so very happy here" the third time, seen when "." ends its last word
# (the 19th token).
LOOP_CUT = "Hello, I am so very happy here. so very happy here. so very happy here"
TASKS = {
    "chat": TaskPolicy("chat", 300, repetition_ngram=4, repetition_count=3),
    "exact": TaskPolicy("exact", 300),  # repetition off
}


def spec(alias: str, config: dict[str, Any]) -> DeploymentSpec:
    return DeploymentSpec(
        id=1,
        name=f"{alias}-looping",
        alias=alias,
        engine_kind="looping",
        config=config,
        quantization="q",
        gpu_type="cpu",
        max_model_len=4096,
    )


@pytest.fixture
async def gateway(engine_kind: Callable[[EngineKind], EngineKind]) -> AsyncIterator[Gateway]:
    engine_kind(LOOPING)
    registry = EngineRegistry()
    await registry.load(
        [
            spec("loop", {"head": ["Hello", ",", " I", " am"], "loop": [" so", " very", " happy", " here", "."]}),
            spec("json", {"head": ['{"a', '": "}', '\\"",', ' "b": [1', ", 2]", "}\n"], "loop": ["\n", " "]}),
            spec("ends", {"head": ["Fine", "."], "loop": [" Yes", "."], "finish_after": 4}),
            spec("json-ends", {"head": ['{"a"', ": 1", "}"], "loop": [" "], "finish_after": 3}),
        ]
    )
    metrics = GatewayMetrics()
    recorder = UsageRecorder(None, interval_s=60)  # type: ignore[arg-type]
    gw = Gateway(
        registry,
        PolicyStore(None, PolicySnapshot(tasks=TASKS)),
        sinks=[recorder, metrics],
        config=GatewayConfig(default_max_tokens=300),
    )
    yield gw
    await registry.close()


def engine(gw: Gateway, alias: str) -> LoopingEngine:
    found = gw.registry.resolve(alias).engine
    assert isinstance(found, LoopingEngine)
    return found


async def answer(gw: Gateway, alias: str, task: str = "chat", stream: bool = False, **fields: Any) -> tuple[str, Any]:
    intent = GenerationIntent(endpoint="chat", alias=alias, stream=stream, prompt="q", task=task, **fields)
    call = await gw.prepare(TENANT, intent)
    lease = await gw.admit(call)
    try:
        text = "".join([d.text async for d in gw.run(lease)])
        assert engine(gw, alias).active_slots == 0  # the slot is free as soon as the answer ends
    finally:
        lease.release()
    return text, call


def saved(gw: Gateway) -> dict[tuple[str, str, str], float]:
    metrics = next(s for s in gw.sinks if isinstance(s, GatewayMetrics))
    families = text_string_to_metric_families(metrics.exposition().decode())
    family = next(f for f in families if f.name == "laneway_decode_tokens_saved")
    return {
        (s.labels["lane"], s.labels["model"], s.labels["reason"]): s.value
        for s in family.samples
        if s.name.endswith("_total")
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_a_looping_answer_is_stopped_its_engine_cancelled_and_the_saving_counted(
    gateway: Gateway, stream: bool
) -> None:
    text, call = await answer(gateway, "loop", stream=stream)
    assert text == LOOP_CUT
    assert call.finish_reason == "stop" and call.early_stop == REPETITION
    looping = engine(gateway, "loop")
    assert looping.cancelled == 1 and looping.decoded == call.completion_tokens == 19
    assert call.tokens_saved == 300 - 19
    assert saved(gateway) == {("default", "loop", REPETITION): 300 - 19}
    [row] = usage_rows(gateway)
    assert row["early_stop"] == REPETITION and row["finish_reason"] == "stop" and row["completion_tokens"] == 19


async def test_the_stopped_text_is_the_unstopped_answer_up_to_the_stop(gateway: Gateway) -> None:
    stopped, _ = await answer(gateway, "loop")
    full, call = await answer(gateway, "loop", task="exact")  # the same answer, repetition off
    assert call.finish_reason == "length" and call.early_stop is None and call.completion_tokens == 300
    assert len(full) > len(stopped) and full.startswith(stopped)
    assert [r["early_stop"] for r in usage_rows(gateway)] == [REPETITION, None]


async def test_a_request_with_ignore_eos_decodes_to_max_tokens(gateway: Gateway) -> None:
    ext = SamplingExtensions(ignore_eos=True)
    _, call = await answer(gateway, "loop", max_tokens=50, extensions=ext)
    assert call.finish_reason == "length" and call.completion_tokens == 50 and call.early_stop is None
    assert saved(gateway) == {}


async def test_a_json_answer_ends_with_its_value(gateway: Gateway) -> None:
    fmt = {"type": "json_object"}
    text, call = await answer(gateway, "json", response_format=fmt)
    assert text == '{"a": "}\\"", "b": [1, 2]}' and json.loads(text) == {"a": '}"', "b": [1, 2]}
    assert call.finish_reason == "stop" and call.early_stop == JSON_COMPLETE
    assert engine(gateway, "json").cancelled == 1 and call.completion_tokens == 6
    assert saved(gateway) == {("default", "json", JSON_COMPLETE): 300 - 6}


async def test_an_answer_the_engine_ends_itself_is_not_an_early_stop(gateway: Gateway) -> None:
    text, call = await answer(gateway, "ends")
    assert text == "Fine. Yes." and call.finish_reason == "stop" and call.early_stop is None
    assert engine(gateway, "ends").cancelled == 0 and saved(gateway) == {}
    # A JSON value the engine ends with (a grammar's end): nothing cut, nothing claimed.
    text, call = await answer(gateway, "json-ends", response_format={"type": "json_object"})
    assert text == '{"a": 1}' and call.finish_reason == "stop" and call.early_stop is None
    assert engine(gateway, "json-ends").cancelled == 0 and saved(gateway) == {}


async def test_each_choice_is_cut_and_the_engine_is_cancelled_when_all_are(gateway: Gateway) -> None:
    intent = GenerationIntent(endpoint="chat", alias="loop", stream=False, prompt="q", task="chat", n=2)
    call = await gateway.prepare(TENANT, intent)
    lease = await gateway.admit(call)
    try:
        texts = ["", ""]
        async for d in gateway.run(lease):
            texts[d.index] += d.text
    finally:
        lease.release()
    assert texts == [LOOP_CUT] * 2
    # The stand-in decodes choices one after another: choice 0 went on to max_tokens in the
    # engine after its cut (nothing saved on it); choice 1 was cancelled at its cut.
    assert call.tokens_saved == 300 - 19 and engine(gateway, "loop").cancelled == 1
