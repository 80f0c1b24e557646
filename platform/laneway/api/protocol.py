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


class FunctionCallIn(Struct, frozen=True):
    name: str
    arguments: str


class ToolCallIn(Struct, frozen=True):
    id: str
    function: FunctionCallIn
    type: Literal["function"] = "function"


class ChatMessageIn(Struct, frozen=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers


FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionDef(Struct, frozen=True, omit_defaults=True):  # omit_defaults: passed on as the client sent it
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; absent: no arguments
    strict: bool | None = None


class ToolDef(Struct, frozen=True, omit_defaults=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Struct, frozen=True, omit_defaults=True):
    name: str


class NamedToolChoice(Struct, frozen=True, omit_defaults=True):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Struct, frozen=True, omit_defaults=True):
    name: Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Struct, frozen=True, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(Struct, frozen=True):
    include_usage: bool = False


# Bounds on what a client may send in the engine-specific extensions: generous for real use,
# small enough that a request body cannot carry a grammar of megabytes to every replica.
TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
ConstraintText = Annotated[str, Meta(max_length=65_536)]


class StructuredOutputs(Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """vLLM's `structured_outputs` (its StructuredOutputsParams): exactly one constraint, passed
    on as sent."""

    json: ConstraintText | dict[str, Any] | None = None
    regex: ConstraintText | None = None
    choice: Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(min_length=1, max_length=1024)] | None = None
    grammar: ConstraintText | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: Annotated[str, Meta(max_length=1024)] | None = None
    structural_tag: ConstraintText | None = None


class _Extensions(Struct, kw_only=True):
    """Engine-specific sampling extensions, named and bounded as vLLM takes them; whether the
    chosen engine honours each is checked after routing (core/capabilities.py)."""

    top_k: Annotated[int, Meta(ge=-1, le=1_000_000)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=256)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None
    structured_outputs: StructuredOutputs | None = None


class _SamplingFields(_Extensions, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Meta(max_length=4)] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    metadata: dict[str, str] | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    # OpenAI's cache-affinity key (checked in api/request.py): the conversation goes back to the
    # replica that served it while load allows. Legacy completions take it too, in the body.
    prompt_cache_key: str | None = None
    # vLLM's prefix-cache salt: the gateway sets its own per tenant (core/pipeline/prepare.py),
    # so a client's, whatever it holds, is dropped unread: never passed on, never a 400.
    cache_salt: Any = None


class ChatCompletionRequest(_SamplingFields, kw_only=True, forbid_unknown_fields=True):
    """Every parameter OpenAI's API takes is declared: an unknown one is a 400 (as OpenAI
    answers it), one that would change the output and cannot be honoured is refused by name
    (api/request.py), and those that change nothing in the answer (store, service_tier,
    safety_identifier, prediction) are accepted and have no effect; prompt_cache_key routes
    the request (see _SamplingFields)."""

    messages: Annotated[list[ChatMessageIn], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    tools: Annotated[list[ToolDef], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # The deprecated function-calling fields: refused loudly (tools replaced them).
    functions: list[Any] | None = None
    function_call: Any = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    # Refused unless they ask for nothing.
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    web_search_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    # Accepted, with no effect on the answer: hints for OpenAI's own storage, billing and caching.
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prediction: dict[str, Any] | None = None  # predicted output only speeds OpenAI up


class CompletionRequest(_SamplingFields, kw_only=True, forbid_unknown_fields=True):
    prompt: str | list[str]
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    response_format: dict[str, Any] | None = None  # not a completions parameter: refused if not text
    suffix: str | None = None
    best_of: int | None = None


# ---- responses -------------------------------------------------------------------------------


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCallOut(Struct):
    name: str
    arguments: str


class ToolCallOut(Struct):
    id: str
    function: FunctionCallOut
    type: str = "function"


class TopLogprobOut(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprobOut]


class ChoiceLogprobs(Struct):
    content: list[TokenLogprobOut] | None
    refusal: None = None


class ChatMessageOut(Struct, omit_defaults=True):
    role: str
    content: str | None  # null when the answer is tool calls (always written: no default)
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    object: str = "chat.completion"


class FunctionCallChunk(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallChunk(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallChunk | None = None


class ChunkDelta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallChunk] | None = None


class ChunkChoice(Struct):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    system_fingerprint: str | None = None
    usage: Usage | None = None
    object: str = "chat.completion.chunk"


class CompletionLogprobs(Struct):
    """The legacy completions shape: parallel lists per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


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
    # laneway's extension: what the model's engine accepts beyond plain text (tools,
    # json_schema, logprobs, n...); a request for anything else is a 400.
    capabilities: list[str] = []


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
