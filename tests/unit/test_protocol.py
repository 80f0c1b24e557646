import msgspec
import pytest
from laneway.api import protocol as p
from laneway.contracts.errors import validation_error


def decode(body: dict[str, object]) -> p.ChatCompletionRequest:
    return msgspec.json.decode(msgspec.json.encode(body), type=p.ChatCompletionRequest)


def test_minimal_chat_request_and_unknown_fields_are_accepted() -> None:
    req = decode({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": False})
    assert req.n == 1 and req.stream is False and req.max_tokens is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}, "temperature"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m", "messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_invalid_bodies_become_400_with_the_offending_param(body: dict[str, object], param: str | None) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        decode(body)
    err = validation_error(info.value)
    assert err.status == 400
    assert err.param == param
    assert err.code == "invalid_request"


def test_malformed_json_is_a_400_invalid_json() -> None:
    with pytest.raises(msgspec.DecodeError) as info:
        msgspec.json.decode(b"{not json", type=p.ChatCompletionRequest)
    err = validation_error(info.value)
    assert err.status == 400 and err.code == "invalid_json"


def test_chunk_delta_omits_unset_fields() -> None:
    assert p.encode(p.ChunkDelta(content="x")) == b'{"content":"x"}'
