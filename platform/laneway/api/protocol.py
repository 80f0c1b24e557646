"""OpenAI wire types as msgspec Structs: strict on what we read, exact on what we write."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]


class ContentPart(Struct, frozen=True):
    type: str
    text: str | None = None


class ChatMessageIn(Struct, frozen=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(Struct, frozen=True):
    include_usage: bool = False


class _SamplingFields(Struct, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: PositiveInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Meta(max_length=4)] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    metadata: dict[str, str] | None = None
    # Read only to refuse them loudly (api/routes.py: unsupported()): no engine adapter
    # implements them yet, and ignoring them would hand an agent or a JSON-mode client plain text.
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessageIn], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


# ---- responses -------------------------------------------------------------------------------


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatMessageOut(Struct):
    role: str
    content: str


class ChatChoice(Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    object: str = "chat.completion"


class ChunkDelta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChunkChoice(Struct):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    system_fingerprint: str | None = None
    usage: Usage | None = None
    object: str = "chat.completion.chunk"


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    object: str = "text_completion"


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str = "laneway"
    object: str = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class ErrorBody(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(Struct):
    error: ErrorBody


encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return encoder.encode(obj)
