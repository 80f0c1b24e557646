"""The official OpenAI SDK (sync and async) against the real gateway and the real tiny llama.cpp model."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from laneway.db.models import UsageRecord
from laneway.db.session import make_engine, make_sessionmaker
from sqlalchemy import select
from support import Gateway, until

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api_url, api_key=gateway.keys["acme"], max_retries=0)


@pytest.fixture
def aclient(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.api_url, api_key=gateway.keys["acme"], max_retries=0)


def test_models_lists_only_what_the_tenant_may_use(gateway: Gateway, client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == ["sim", "tiny", "tiny-exact"]
    assert client.models.retrieve("tiny").id == "tiny"
    only_sim = openai.OpenAI(base_url=gateway.api_url, api_key=gateway.keys["simonly"], max_retries=0)
    assert [m.id for m in only_sim.models.list()] == ["sim"]


def test_chat_completion_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny-exact", messages=MSGS, max_tokens=12, seed=1)
    assert r.object == "chat.completion" and r.model == "tiny-exact"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_streaming_equals_non_streaming_for_the_same_seed(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=40, seed=42, temperature=0.9)
    stream = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=40,
        seed=42,
        temperature=0.9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_sends_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="tiny-exact", messages=MSGS, max_tokens=5, stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_seed_makes_output_reproducible_and_different_seeds_differ(client: openai.OpenAI) -> None:
    def run(seed: int) -> str | None:
        return (
            client.chat.completions.create(model="tiny-exact", messages=MSGS, max_tokens=24, seed=seed)
            .choices[0]
            .message.content
        )

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_temperature_zero_is_greedy(client: openai.OpenAI) -> None:
    outs = {
        client.completions.create(model="tiny-exact", prompt="the", max_tokens=16, temperature=0, seed=s)
        .choices[0]
        .text
        for s in (1, 2, 3)
    }
    assert len(outs) == 1
    # top_p near 0 keeps only the most likely token: also greedy, whatever the temperature.
    nucleus = {
        client.completions.create(
            model="tiny-exact", prompt="the", max_tokens=16, temperature=1.5, top_p=0.0001, seed=s
        )
        .choices[0]
        .text
        for s in (1, 2, 3)
    }
    assert nucleus == outs
    wide = {
        client.completions.create(model="tiny-exact", prompt="the", max_tokens=16, temperature=1.5, seed=s)
        .choices[0]
        .text
        for s in (1, 2, 3)
    }
    assert len(wide) > 1


def test_completions_non_streaming_and_streaming(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny-exact", prompt="hello", max_tokens=8, seed=3)
    assert r.object == "text_completion" and r.usage is not None and r.usage.completion_tokens == 8
    chunks = list(client.completions.create(model="tiny-exact", prompt="hello", max_tokens=8, seed=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_sequence_is_honoured(client: openai.OpenAI) -> None:
    full = (
        client.completions.create(model="tiny-exact", prompt="hello", max_tokens=60, seed=9, temperature=0)
        .choices[0]
        .text
    )
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    r = client.completions.create(model="tiny-exact", prompt="hello", max_tokens=60, seed=9, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny-exact", prompt="hello", max_tokens=60, seed=9, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text


async def test_async_client_streams_concurrently(aclient: openai.AsyncOpenAI) -> None:
    async def one(i: int) -> str:
        stream = await aclient.chat.completions.create(
            model="tiny-exact", messages=MSGS, max_tokens=10, seed=i, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    outs = await asyncio.gather(*(one(i) for i in range(6)))
    assert all(outs) and len(set(outs)) > 1
    r = await aclient.chat.completions.create(model="sim", messages=MSGS, max_tokens=3)
    assert r.system_fingerprint == "laneway-sim"  # the simulator says what it is


# ---- errors reach the SDK as its own exception classes -----------------------------------------


@pytest.mark.parametrize("key", ["missing", "lw-wrong", "revoked", "expired"])
def test_bad_keys_raise_authentication_error(gateway: Gateway, key: str) -> None:
    api_key = gateway.keys.get(key, key)
    c = openai.OpenAI(base_url=gateway.api_url, api_key=api_key, max_retries=0)
    if key == "missing":
        c = openai.OpenAI(base_url=gateway.api_url, api_key="x", max_retries=0, default_headers={"Authorization": ""})
    with pytest.raises(openai.AuthenticationError) as info:
        c.chat.completions.create(model="tiny", messages=MSGS)
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"  # type: ignore[index]


def test_disabled_tenant_and_disallowed_model_raise_permission_denied(gateway: Gateway) -> None:
    frozen = openai.OpenAI(base_url=gateway.api_url, api_key=gateway.keys["frozen"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        frozen.chat.completions.create(model="tiny", messages=MSGS)
    simonly = openai.OpenAI(base_url=gateway.api_url, api_key=gateway.keys["simonly"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as info:
        simonly.chat.completions.create(model="tiny", messages=MSGS)
    assert info.value.body["code"] == "model_not_allowed"  # type: ignore[index]


def test_unknown_model_raises_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=MSGS)
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"n": 17}, "n"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content",
        ),
    ],
)
def test_bad_bodies_raise_bad_request_with_param(client: openai.OpenAI, kwargs: dict, param: str) -> None:
    args = {"model": "tiny", "messages": MSGS, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**args)
    assert info.value.body["param"] == param  # type: ignore[index]
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_prompt_longer_than_the_context_is_400_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:  # as OpenAI answers it
        client.completions.create(model="tiny-exact", prompt="hello world " * 400, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"  # type: ignore[index]


WEATHER_TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tools": [WEATHER_TOOL]}, "tools"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"n": 2}, "n"),
    ],
)
def test_what_the_engine_cannot_do_is_a_loud_400_not_a_quiet_200(
    client: openai.OpenAI, kwargs: dict, param: str
) -> None:
    """An agent asking for a tool call, or a JSON-mode client, must not get plain text as if
    its request had been honoured: the sim engine declares none of these capabilities, so it
    gets BadRequestError naming the parameter (llama.cpp serves them all: test_openai_features)."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="sim", messages=MSGS, max_tokens=2, **kwargs)
    assert info.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert info.value.body["param"] == param  # type: ignore[index]


def test_the_values_that_ask_for_nothing_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=2,
        n=1,
        presence_penalty=0,
        frequency_penalty=0,
        response_format={"type": "text"},
        tool_choice="none",
        logprobs=False,
    )
    assert r.choices[0].finish_reason == "length"
    for model, kwargs, param in (
        ("sim", {"logprobs": 1}, "logprobs"),
        ("tiny", {"suffix": "end"}, "suffix"),
        ("tiny", {"best_of": 3}, "best_of"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=model, prompt="hi", max_tokens=2, **kwargs)
        assert (info.value.body["code"], info.value.body["param"]) == ("unsupported_parameter", param)  # type: ignore[index]


def test_raw_http_errors_are_in_openai_shape(gateway: Gateway) -> None:
    h = {"Authorization": f"Bearer {gateway.keys['acme']}"}
    for body in (b"", b"{bad json", b"[]"):
        r = httpx.post(gateway.api_url + "/chat/completions", content=body, headers=h)
        assert r.status_code == 400, body
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(gateway.base_url + "/v1/nope", headers=h)
    assert r.status_code == 404 and "error" in r.json()


def test_health_endpoints(gateway: Gateway) -> None:
    assert httpx.get(gateway.base_url + "/health/live").status_code == 200
    ready = httpx.get(gateway.base_url + "/health/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


async def test_usage_rows_are_written_for_each_request(gateway: Gateway, aclient: openai.AsyncOpenAI) -> None:
    r = await aclient.chat.completions.create(model="tiny-exact", messages=MSGS, max_tokens=7, user="u-1")
    engine = make_engine(gateway.database_url)
    sessions = make_sessionmaker(engine)
    try:
        row = None

        async def written() -> bool:
            nonlocal row
            async with sessions() as s:
                row = (await s.execute(select(UsageRecord).where(UsageRecord.request_id == r.id))).scalar_one_or_none()
            return row is not None

        await until(written, within=5, step=0.02, what="the usage row")
        assert row is not None
        assert (row.model, row.status, row.completion_tokens, row.endpoint) == ("tiny-exact", 200, 7, "chat")
        assert row.prompt_tokens == r.usage.prompt_tokens  # type: ignore[union-attr]
        assert row.end_user == "u-1"
        assert row.deployment == "tiny-exact-llamacpp" and row.total_ms is not None and row.ttft_ms is not None
    finally:
        await engine.dispose()


async def test_engine_fault_mid_stream_is_an_api_error_and_harms_no_other_request(
    aclient: openai.AsyncOpenAI,
) -> None:
    async def faulty() -> str:
        stream = await aclient.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "<<laneway-sim-fault>>"}], max_tokens=20, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def healthy() -> int:
        r = await aclient.chat.completions.create(model="sim", messages=MSGS, max_tokens=20)
        return r.usage.completion_tokens  # type: ignore[union-attr]

    results = await asyncio.gather(faulty(), healthy(), healthy(), return_exceptions=True)
    assert isinstance(results[0], openai.APIError) and "simulated engine fault" in str(results[0])
    assert results[1:] == [20, 20]
    with pytest.raises(openai.InternalServerError) as info:  # non-streaming: a 503 before any byte
        await aclient.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "<<laneway-sim-fault>>"}], max_tokens=20
        )
    assert info.value.status_code == 503 and info.value.body["code"] == "engine_error"  # type: ignore[index]
    assert info.value.response.headers["retry-after"] == "1"
