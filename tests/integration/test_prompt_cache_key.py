"""prompt_cache_key through the real gateway with the official SDK: chat, completions and
Responses take it, and refuse a key that could not be kept as a routing record (a NUL, a
control character, empty, over 256 characters) with a 400 naming it, as OpenAI's error shape
has it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from support import Gateway, sim_model, start_gateway


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    seed_with = {"models": {"sim": sim_model("sim", max_concurrency=4, decode_ms_base=0.1)}, "tenants": {"acme": {}}}
    gw: Gateway = start_gateway(tmp_path_factory.mktemp("cache-key"), seed_with=seed_with)
    yield openai.OpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
    gw.stop()


def chat(client: openai.OpenAI, key: str) -> Any:
    return client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2, prompt_cache_key=key
    )


def completions(client: openai.OpenAI, key: str) -> Any:
    # The SDK's legacy completions has no such argument; OpenAI's API takes it in the body.
    return client.completions.create(model="sim", prompt="hi", max_tokens=2, extra_body={"prompt_cache_key": key})


def responses(client: openai.OpenAI, key: str) -> Any:
    return client.responses.create(model="sim", input="hi", max_output_tokens=16, prompt_cache_key=key)


ENDPOINTS = pytest.mark.parametrize("call", [chat, completions, responses], ids=["chat", "completions", "responses"])


@ENDPOINTS
@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("conversation-7\x00", "must not contain NUL or other control characters"),
        ("line\nbreak", "must not contain NUL or other control characters"),
        ("k" * 257, "must be at most 256 characters (got 257)"),
        ("", "must not be empty"),
    ],
    ids=["nul", "newline", "257-chars", "empty"],
)
def test_a_key_that_cannot_be_kept_is_a_400_naming_it(
    client: openai.OpenAI, call: Callable[[openai.OpenAI, str], Any], key: str, said: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call(client, key)
    error = info.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["type"], error["code"]) == (
        "prompt_cache_key",
        "invalid_request_error",
        "invalid_request",
    )
    assert error["message"] == f"`prompt_cache_key` {said}."


@ENDPOINTS
@pytest.mark.parametrize("key", ["user-42:thread-9", "ü" * 256], ids=["plain", "256-chars"])
def test_a_sane_key_is_served(client: openai.OpenAI, call: Callable[[openai.OpenAI, str], Any], key: str) -> None:
    answer = call(client, key)
    assert answer.usage is not None and answer.id


def test_the_key_reaches_the_pipelines_intent() -> None:
    """What the dispatcher reads (GenerationIntent.prompt_cache_key), from each endpoint's body."""
    import msgspec
    from laneway.api import protocol as p
    from laneway.api.request import chat_intent, completion_intent, hints
    from laneway.api.responses import protocol as rp

    class Request:
        headers: dict[str, str] = {}
        scope: dict[str, Any] = {}

    def body(kind: type[Any], **fields: Any) -> Any:
        return msgspec.convert({"model": "sim", "prompt_cache_key": "thread-9", **fields}, kind)

    chat_req = body(p.ChatCompletionRequest, messages=[{"role": "user", "content": "hi"}])
    assert chat_intent(Request(), chat_req).prompt_cache_key == "thread-9"  # type: ignore[arg-type]
    assert completion_intent(Request(), body(p.CompletionRequest, prompt="hi")).prompt_cache_key == "thread-9"  # type: ignore[arg-type]
    assert hints(Request(), body(rp.ResponsesRequest, input="hi"))["prompt_cache_key"] == "thread-9"  # type: ignore[arg-type]
    without = msgspec.convert({"model": "sim", "prompt": "hi"}, p.CompletionRequest)
    assert completion_intent(Request(), without).prompt_cache_key is None  # type: ignore[arg-type]
